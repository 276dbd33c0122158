"""The builders: what writes model files, never what checks them (only commands import this wing).

`training/` trains the embedded tiny pairs under parity/assets/ (`parity models
build`, `make models`) and writes the long prompts of `long-context-8k`;
`synth/` writes calibrated random-weights pairs of real shapes (`parity models
synth`); `saver.py` and `shards.py` write the Hugging Face layouts
`parity.models.loader` reads.
"""
