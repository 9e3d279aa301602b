"""The D5005 cost model's band for Llama 3.1 8B in bf16 at ctx 8192 on the engine as printed, with its bank word
of 64 bytes (the default) and of 128 (a datapath twice as wide, for clock margin): what each routine costs at the
band's low end, and which on-chip arrays the model finds arbitrated. A model's figures, not a measurement.

    python bench/d5005_band.py
"""

from __future__ import annotations

from logos_ir.author import written
from logos_ir.dialects import d5005
from logos_ir.parser import parse_program
from logos_ir.passes.d5005 import cost_model
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_program


def main() -> None:
    text, _ = written(ModelSpec.preset("llama-3.1-8b"), Cut.decode(8192))
    program = parse_program(text.text, "<decode>")
    for burst in (64, 128):
        lowered = lower_program(program, "bf16", d5005.EngineParams(burst_bytes=burst))
        band = cost_model.band(lowered)
        low, high = band["band_tokens_per_s"]
        print(f"bank word {burst} bytes: {low} to {high} tokens/s (roofline {band['roofline_tokens_per_s']})")
        print(f"    ms by routine at the low end: {band['low']['ms_by_opcode']}")
        print(f"    arbitrated (banks): {band['arbitrated']}")


if __name__ == "__main__":
    main()
