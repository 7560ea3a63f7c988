"""A small causal language model for generation (decision 23): the model and its
paged-KV runner, the tokenizer, the shipped weights and the script that trains them."""
