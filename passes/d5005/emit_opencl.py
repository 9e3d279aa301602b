"""The D5005 engine itself, as OpenCL C for Intel's FPGA SDK for OpenCL, parameterised from the dialect.

One single work-item kernel, `d5005_engine`, reads the instruction stream word by word and runs one routine per
opcode (embedding row, matvec, RMS norm, RoPE, cache write, attention, SiLU*mul, add, arg-max): one launch is one
decode step. The routines are generic over shapes (rows, columns, heads come from the instruction word), so every
layer shares them and a new model needs no new bitstream. The engine's parameters (burst, vector width, MAC lanes,
on-chip words, weight precision) are `#define`s taken from the `d5005.program`'s `EngineParams`.

Intel's specifics sit behind macros: with `INTELFPGA_CL` (defined by `aoc`) the kernel is single work-item
(`max_global_work_dim(0)`), the instructions arrive over an Intel channel from a `d5005_fetch` kernel, the bank
arguments carry `buffer_location`, the on-chip buffers are a kernel-scope array (M20K), and `UNROLL` unrolls the
bank and vector loops; on any other OpenCL device the same source builds with the instructions read from global
memory, the on-chip buffers in a global scratch buffer, and no unrolling pragmas. `EngineTarget` is the
`-t d5005-opencl` emitter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import DiagnosticException
from xdsl.utils.target import Target

from logos_ir.dialects import d5005

ENGINE_KERNEL = "d5005_engine"


def engine_source(identity: str, params: d5005.EngineParams) -> str:
    """The engine's OpenCL C for `params`, its first line the identity line of the program it was emitted for."""
    defines = "\n".join(
        [
            f"#define BANKS {d5005.BANKS}",
            f"#define BURST_BYTES {params.burst_bytes}",
            f"#define VECTOR_WIDTH {params.vector_width}",
            f"#define MAC_LANES {params.mac_lanes}",
            f"#define ONCHIP_WORDS {params.onchip_words}",
            f"#define WEIGHT_BYTES {d5005.WEIGHT_BYTES[params.weights]}",
            f"#define INSTRUCTION_WORDS {d5005.INSTRUCTION_WORDS}",
            *(f"#define OP_{name.split('.')[1].upper()} {code}" for name, code in d5005.OPCODES.items()),
        ]
    )
    about = (
        f"// D5005 decode engine: {params.clock_mhz} MHz, {params.burst_bytes}-byte bursts, vector width"
        f" {params.vector_width}, {params.mac_lanes} MAC lanes, {params.onchip_words} on-chip words, {params.weights}"
        " weights"
    )
    return f"// {identity}\n{about}\n{defines}\n{_BODY}"


_BODY = r"""
#if defined(INTELFPGA_CL)
#pragma OPENCL EXTENSION cl_intel_channels : enable
#define PRAGMA(x) _Pragma(#x)
#define UNROLL(n) PRAGMA(unroll n)
#define ENGINE __attribute__((max_global_work_dim(0))) __attribute__((uses_global_work_offset(0))) __kernel
#define BANK_ARG(n) __global __attribute__((buffer_location("DDR"))) uchar *restrict bank##n
#define ONCHIP
#define ONCHIP_DECL float onchip[ONCHIP_WORDS] __attribute__((bankwidth(4 * VECTOR_WIDTH)))
channel uint16 instructions __attribute__((depth(8)));
#define NEXT_INSTRUCTION(program, pc) read_channel_intel(instructions)

/* Feeds the engine its instructions over a channel, so instruction fetch never stalls the bank streams. */
ENGINE void d5005_fetch(__global const uint16 *restrict program, const uint count) {
    for (uint pc = 0; pc < count; pc++) write_channel_intel(instructions, program[pc]);
}
#else
#define UNROLL(n)
#define ENGINE __kernel
#define BANK_ARG(n) __global uchar *restrict bank##n
#define ONCHIP __global
#define ONCHIP_DECL ONCHIP float *onchip = scratch
#define NEXT_INSTRUCTION(program, pc) (((__global const uint16 *)(program))[pc])
#endif

#if WEIGHT_BYTES == 2
typedef ushort weight_t; /* bf16: the upper half of a float32 */
#define WEIGHT(row, k) as_float(((uint)(row)[k]) << 16)
#else
typedef float weight_t;
#define WEIGHT(row, k) ((row)[k])
#endif

typedef struct { __global uchar *bank[BANKS]; } banks_t;

/* Row r of a region lives in bank r % BANKS at offset + (r / BANKS) * stride: the same offsets in every bank. */
inline __global uchar *row_at(const banks_t *b, const uint16 *w, uint offset_field, uint r) {
    ulong offset = (ulong)(offset_field == 8 ? w->s8 : w->s6) * BURST_BYTES;
    return b->bank[r % BANKS] + offset + (ulong)(r / BANKS) * w->s7;
}

inline float dot_row(__global const weight_t *row, ONCHIP const float *x, uint cols) {
    float lane[VECTOR_WIDTH];
    UNROLL(VECTOR_WIDTH)
    for (uint v = 0; v < VECTOR_WIDTH; v++) lane[v] = 0.0f;
    uint c = 0;
    for (; c + VECTOR_WIDTH <= cols; c += VECTOR_WIDTH) {
        UNROLL(VECTOR_WIDTH)
        for (uint v = 0; v < VECTOR_WIDTH; v++) lane[v] += WEIGHT(row, c + v) * x[c + v];
    }
    for (uint v = 0; c + v < cols; v++) lane[v] += WEIGHT(row, c + v) * x[c + v];
    float sum = 0.0f;
    UNROLL(VECTOR_WIDTH)
    for (uint v = 0; v < VECTOR_WIDTH; v++) sum += lane[v];
    return sum;
}

inline void embed_row(ONCHIP float *x, const banks_t *b, const uint16 *w, uint token) {
    __global const weight_t *row = (__global const weight_t *)row_at(b, w, 6, token - 1);
    for (uint k = 0; k < w->s5; k++) x[w->s1 + k] = WEIGHT(row, k);
}

/* Bank b streams rows b, b + 4, ...: the four banks feed the MAC lanes at once. */
inline void matvec(ONCHIP float *x, const banks_t *b, const uint16 *w) {
    uint rows = w->s4, per_bank = (rows + BANKS - 1) / BANKS;
    for (uint i = 0; i < per_bank; i++) {
        UNROLL(BANKS)
        for (uint k = 0; k < BANKS; k++) {
            uint r = i * BANKS + k;
            if (r < rows) x[w->s1 + r] = dot_row((__global const weight_t *)row_at(b, w, 6, r), x + w->s2, w->s5);
        }
    }
}

inline void rms_norm(ONCHIP float *x, const banks_t *b, const uint16 *w) {
    uint n = w->s5;
    __global const weight_t *weight = (__global const weight_t *)row_at(b, w, 6, 0);
    float squares = 0.0f;
    for (uint k = 0; k < n; k++) squares += x[w->s2 + k] * x[w->s2 + k];
    float scale = 1.0f / sqrt(squares * (1.0f / (float)n) + as_float(w->sd));
    for (uint k = 0; k < n; k++) x[w->s1 + k] = (x[w->s2 + k] * scale) * WEIGHT(weight, k);
}

/* The table's row for the position holds cos of each half-frequency, then sin. */
inline void rope(ONCHIP float *x, const banks_t *b, const uint16 *w, uint position) {
    uint head_dim = w->sb, mid = head_dim / 2;
    __global const float *table = (__global const float *)row_at(b, w, 6, position - 1);
    for (uint h = 0; h < w->se; h += head_dim) {
        for (uint i = 0; i < mid; i++) {
            float first = x[w->s2 + h + i], second = x[w->s2 + h + mid + i];
            float c = table[i], s = table[mid + i];
            x[w->s1 + h + i] = first * c + second * (-s);
            x[w->s1 + h + mid + i] = second * c + first * s;
        }
    }
}

inline void cache_write(ONCHIP float *x, const banks_t *b, const uint16 *w, uint position) {
    uint head_dim = w->s5, ctx = w->s4 / w->sa;
    for (uint h = 0; h < w->sa; h++) {
        __global float *row = (__global float *)row_at(b, w, 6, h * ctx + position - 1);
        for (uint k = 0; k < head_dim; k++) row[k] = x[w->s2 + h * head_dim + k];
    }
}

inline void attention(ONCHIP float *x, const banks_t *b, const uint16 *w, uint position) {
    uint heads = w->s9, kv_heads = w->sa, head_dim = w->sb, ctx = w->sc, group = heads / kv_heads;
    float scale = as_float(w->sd);
    ONCHIP float *scores = x + w->s3;
    for (uint h = 0; h < heads; h++) {
        ONCHIP const float *q = x + w->s2 + h * head_dim;
        uint base = (h / group) * ctx;
        float top = -INFINITY;
        for (uint t = 0; t < position; t++) {
            __global const float *key = (__global const float *)row_at(b, w, 6, base + t);
            float s = 0.0f;
            for (uint k = 0; k < head_dim; k++) s += q[k] * key[k];
            scores[t] = s * scale;
            top = fmax(top, scores[t]);
        }
        float total = 0.0f;
        for (uint t = 0; t < position; t++) {
            scores[t] = exp(scores[t] - top);
            total += scores[t];
        }
        for (uint t = 0; t < position; t++) scores[t] /= total;
        ONCHIP float *out = x + w->s1 + h * head_dim;
        for (uint k = 0; k < head_dim; k++) out[k] = 0.0f;
        for (uint t = 0; t < position; t++) {
            __global const float *value = (__global const float *)row_at(b, w, 8, base + t);
            for (uint k = 0; k < head_dim; k++) out[k] += scores[t] * value[k];
        }
    }
}

inline void silu_mul(ONCHIP float *x, const uint16 *w) {
    for (uint k = 0; k < w->s4; k++) {
        float g = x[w->s2 + k];
        x[w->s1 + k] = (g * (tanh(g * 0.5f) * 0.5f + 0.5f)) * x[w->s3 + k];
    }
}

inline void add(ONCHIP float *x, const uint16 *w) {
    for (uint k = 0; k < w->s4; k++) x[w->s1 + k] = x[w->s2 + k] + x[w->s3 + k];
}

inline uint argmax(ONCHIP const float *x, const uint16 *w) {
    uint best = 0;
    for (uint k = 1; k < w->s4; k++) if (x[w->s2 + k] > x[w->s2 + best]) best = k;
    return best + 1;
}

/* One launch is one decode step: token and position count from 1; result[0] is the next token, from 1. */
ENGINE void d5005_engine(__global const uint *restrict program, const uint count,
                         BANK_ARG(0), BANK_ARG(1), BANK_ARG(2), BANK_ARG(3),
                         __global float *restrict scratch, const uint token, const uint position,
                         __global uint *restrict result) {
    ONCHIP_DECL;
    banks_t b;
    b.bank[0] = bank0; b.bank[1] = bank1; b.bank[2] = bank2; b.bank[3] = bank3;
    uint next = 0;
    for (uint pc = 0; pc < count; pc++) {
        const uint16 w = NEXT_INSTRUCTION(program, pc);
        switch (w.s0) {
        case OP_EMBED_ROW: embed_row(onchip, &b, &w, token); break;
        case OP_MATVEC: matvec(onchip, &b, &w); break;
        case OP_RMS_NORM: rms_norm(onchip, &b, &w); break;
        case OP_ROPE: rope(onchip, &b, &w, position); break;
        case OP_CACHE_WRITE: cache_write(onchip, &b, &w, position); break;
        case OP_ATTENTION: attention(onchip, &b, &w, position); break;
        case OP_SILU_MUL: silu_mul(onchip, &w); break;
        case OP_ADD: add(onchip, &w); break;
        case OP_ARGMAX: next = argmax(onchip, &w); break;
        default: break;
        }
    }
    result[0] = next;
}
"""


@dataclass(frozen=True)
class EngineTarget(Target):
    """`-t d5005-opencl`: the engine's OpenCL C for the `d5005.program` in the module."""

    name: ClassVar[str] = "d5005-opencl"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        program = the_d5005_program(module, self.name)
        output.write(engine_source(program.identity.data, program.params))


def the_d5005_program(module: ModuleOp, target: str) -> d5005.ProgramOp:
    found = [op for op in module.ops if isinstance(op, d5005.ProgramOp)]
    if len(found) != 1:
        raise DiagnosticException(f"{target} target: expects one d5005.program in the module, found {len(found)}")
    return found[0]
