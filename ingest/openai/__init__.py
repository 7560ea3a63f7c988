"""OpenAI's protocol on the durable path: embeddings, completions, files and batches
(decisions 32, 34 and 35). Errors in OpenAI's shape."""
