"""The job API: uploads staged and recorded in two phases (decisions 10 and 26), the
job's items put in Kafka, status and results read back, webhooks (decision 27)."""
