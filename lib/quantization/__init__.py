"""Quantizing a model (week 20); the block formats and their kernels are `lib.gguf`.

- `lib.quantization.quant`         whole models: per-tensor type plans, imatrix, RTN, writing a GGUF, llama.cpp
- `lib.quantization.gptq`          GPTQ: Hessian-based column-by-column error compensation; calibration inputs
- `lib.quantization.awq`           AWQ: activation-aware channel scales and their grid search; salient channels
- `lib.quantization.smoothquant`   W8A8 with activation outliers migrated into the weights
- `lib.quantization.quant_linear`  int8 / int4 weight-only linears; the model on the GGUF file's own blocks
"""
