"""The text side of fine-tuning a pretrained language model: the model's own tokenizer run at its
library's speed (`tokenizer`), the corpus read from .txt/.jsonl files, its examples tokenized into
training rows and kept in a token cache on disk, and the generation of completions from prompts."""
