"""The builder of the embedded tiny pair `tiny-llama3-eagle` (corpus, tokenizer, training)."""
