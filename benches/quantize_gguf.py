#!/usr/bin/env python3
"""Re-quantises a GGUF file with llama.cpp's quantiser (through llama-cpp-python's
`llama_model_quantize`), for speed figures of other block formats than the file's own:

    python3 benches/quantize_gguf.py IN.gguf OUT.gguf [--type Q4_K_M]

Re-quantising an already quantised file (SmolLM2's Q4_1) compounds the rounding: the output is
fit for speed comparisons (`compare_llamacpp.py --model OUT.gguf`), not for quality ones. Tensors
whose rows do not split into the format's super-blocks (SmolLM2's 576 columns are not a multiple
of 256) get llama.cpp's fallback type; the script prints the count of tensors of each type.
The output is written to a temporary file beside it and renamed when complete.
"""
import argparse
import collections
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--type", default="Q4_K_M", help="a LLAMA_FTYPE_MOSTLY_* suffix")
    args = parser.parse_args()
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.type}", None)
    if ftype is None:
        sys.exit(f"llama_cpp has no LLAMA_FTYPE_MOSTLY_{args.type}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    tmp = args.output + ".tmp"
    code = llama_cpp.llama_model_quantize(args.input.encode(), tmp.encode(), params)
    if code != 0:
        if os.path.exists(tmp):
            os.remove(tmp)
        sys.exit(f"llama_model_quantize failed ({code})")
    os.replace(tmp, args.output)
    try:
        import gguf  # the `gguf` package, when installed: what the file holds

        types = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(args.output).tensors)
        print("tensor types:", dict(types))
    except ImportError:
        pass
    print(args.output)


if __name__ == "__main__":
    main()
