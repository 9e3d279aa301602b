"""The D5005 engine itself, as OpenCL C for Intel's FPGA SDK for OpenCL, parameterised from the dialect.

Five kernels, all single work-item: one **bank reader** per DDR4 bank (`d5005_read_bank0` .. `3`), each streaming
its rows of every region an instruction reads in 512-bit words (one burst a word), and the **compute kernel**
(`d5005_compute`), which runs one routine per opcode (embedding row, matvec, RMS norm, RoPE, cache write,
attention, SiLU*mul, add, arg-max) on what the four readers send it, so the four banks stream at once. All five
walk the same instruction words; one pass over them is one decode step. The routines are generic over shapes
(rows, columns, heads come from the instruction word), so every layer shares them and a new model needs no new
bitstream. Parameters (burst, vector width, weight and cache precision, the datapath's limits) are `#define`s
taken from the `d5005.program`'s `EngineParams`.

One source, two builds. With `INTELFPGA_CL` (defined by `aoc`) the readers feed the compute kernel through Intel
channels (`cl_intel_channels`), the bank arguments carry `buffer_location`, the on-chip buffers are in five
kernel-scope local arrays (M20K), one a kind of buffer, each banked a float32 word a bank over a bank word, and
`UNROLL`, `IVDEP` and `IVDEP_SAFELEN` are Intel's pragmas. On any other OpenCL device (PoCL's CPU device here)
the arrays are slices of one scratch buffer and each channel is an ordered buffer: the host launches the four
readers over a run of instructions, each filling its buffer in channel order, then the compute kernel over the same
run, draining them in the same order (`logos_ir.runtime.d5005`). Each pipelined loop is marked `/* loop NAME */`
and each routine `/* routine NAME */`; `engine_loops.py` states those loops as data, which the cost model costs.
`OpenclTarget` is the `-t d5005-opencl` emitter.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from string import Template
from typing import IO, ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import DiagnosticException
from xdsl.utils.target import Target

from logos_ir.dialects import d5005

SHIFT_DEPTH = 8  # partial sums a carried floating-point add rotates through: covers its latency (docs/d5005.md)
SLOT_DISTANCE = 2 * SHIFT_DEPTH  # iterations, at least, between two updates of one attention accumulator
CHANNEL_DEPTH = 512  # bank words each reader may run ahead of the compute kernel


# The engine's optional parts: each printed (its routine's loops, its field of an instruction word, its on-chip
# array, and a `#define ENGINE_<NAME> 1` that says it is there) only in an engine whose program uses it, so the
# engine of a program that uses none is the one printed without them.
FEATURES = (
    "bias",
    "window",
    "head_norm",
    "partial_rotary",
    "embed_scale",
    "plus_one",
    "gelu_tanh",
    "sandwich",
    "logit_softcap",
    "softcap",
    "columns",
    "stored",
    "experts",
    "projection_norms",
)


def engine_features(program: d5005.ProgramOp) -> frozenset[str]:
    """The optional parts of the engine that `program`'s instructions use: `bias`, a matvec adding a bias;
    `window`, an attention over a sliding window; `head_norm`, a rope that RMS-norms each head first;
    `partial_rotary`, a rope that rotates a part of each head."""
    found = set()
    if any(isinstance(op, d5005.MatvecOp) and op.bias is not None for op in program.instructions()):
        found.add("bias")
    if any(isinstance(op, d5005.AttentionOp) and op.window is not None for op in program.instructions()):
        found.add("window")
    if any(isinstance(op, d5005.RopeOp) and op.norm is not None for op in program.instructions()):
        found.add("head_norm")
    if any(isinstance(op, d5005.RopeOp) and op.rotary_dim is not None for op in program.instructions()):
        found.add("partial_rotary")
    for op in program.instructions():
        if isinstance(op, d5005.EmbedRowOp) and op.scale is not None:
            found.add("embed_scale")
        if isinstance(op, (d5005.RMSNormOp, d5005.RopeOp)) and op.plus_one is not None:
            found.add("plus_one")
        if isinstance(op, d5005.SiluMulOp) and op.gelu_tanh is not None:
            found.add("gelu_tanh")
        if isinstance(op, d5005.RMSNormOp) and _array(op.src) == "outputs":
            found.add("sandwich")
        if isinstance(op, d5005.RopeOp) and _array(op.src) == "inputs":
            found.add("projection_norms")
        if isinstance(op, d5005.AddOp) and _array(op.rhs) == "inputs":
            found.add("sandwich")
        if isinstance(op, d5005.ArgmaxOp) and op.cap is not None:
            found.add("logit_softcap")
        if isinstance(op, d5005.AttentionOp) and op.softcap is not None:
            found.add("softcap")
        if isinstance(op, d5005.MatvecOp) and op.part[0]:
            found.add("columns")
        if isinstance(op, d5005.MatvecOp) and op.weight.stored or isinstance(op, d5005.EmbedRowOp) and op.table.stored:
            found.add("stored")
        if (
            isinstance(op, (d5005.RouteOp, d5005.ExpertSumOp))
            or isinstance(op, d5005.AddOp)
            and _array(op.rhs) == "attended"
        ):
            found.add("experts")
    return frozenset(found)


def _array(buffer: object) -> str | None:
    owner = getattr(buffer, "owner", None)
    return owner.array_name if isinstance(owner, d5005.BufferOp) else None


def _feature_constants(features: frozenset[str]) -> dict[str, int]:
    found = {}
    if "bias" in features:
        found |= {"ENGINE_BIAS": 1, "BIAS_WORDS": d5005.BIAS_WORDS}
    if "window" in features:
        found["ENGINE_WINDOW"] = 1
    if "head_norm" in features:
        found["ENGINE_HEAD_NORM"] = 1
    if "partial_rotary" in features:
        found["ENGINE_PARTIAL_ROTARY"] = 1
    for feature in (
        "embed_scale", "plus_one", "gelu_tanh", "sandwich", "logit_softcap", "softcap", "columns", "projection_norms",
    ):  # fmt: skip
        if feature in features:
            found[f"ENGINE_{feature.upper()}"] = 1
    if "columns" in features:
        found["PRIOR_WORDS"] = d5005.PRIOR_WORDS
    if "experts" in features:
        found |= {"ENGINE_EXPERTS": 1, "EXPERTS_MAX": d5005.EXPERTS_MAX, "TOP_K_MAX": d5005.TOP_K_MAX}
    if "stored" in features:
        found |= {"ENGINE_STORED": 1, **{f"FORMAT_{f.upper()}": code for f, code in d5005.STORED_FORMATS.items()}}
        found |= {f"GROUP_WORDS_{f.upper()}": _group_words(f) for f in d5005.STORED_FORMATS}
    return found


def _group_words(fmt: str) -> int:
    """Bank words of a whole group of a stored format: its scale words and its code words."""
    return d5005.STORED_SCALE_WORDS[fmt] + 2 * d5005.STORED_BITS[fmt]


def engine_constants(params: d5005.EngineParams, features: frozenset[str] = frozenset()) -> dict[str, int]:
    """The engine's parameters, as the source's `#define`s state them (the cost model reads them here)."""
    weight_bytes = d5005.WEIGHT_BYTES[params.weights]
    return {
        "BANKS": d5005.BANKS,
        "BURST_BYTES": params.burst_bytes,
        "VECTOR_WIDTH": params.vector_width,
        "MAC_LANES": params.mac_lanes,
        "ONCHIP_WORDS": params.onchip_words,
        "WEIGHT_BYTES": weight_bytes,
        "CACHE_BYTES": weight_bytes,
        "INSTRUCTION_WORDS": d5005.INSTRUCTION_WORDS,
        "SHIFT_DEPTH": SHIFT_DEPTH,
        "SLOT_DISTANCE": SLOT_DISTANCE,
        "CHANNEL_DEPTH": CHANNEL_DEPTH,
        "GROUP_MAX": d5005.GROUP_MAX,
        "ROW_WORDS_MAX": d5005.ROW_WORDS_MAX,
        "VECTOR_WORDS": d5005.VECTOR_WORDS,
        "ARRAY_SHIFT": d5005.OFFSET_BITS,
        "OFFSET_MASK": (1 << d5005.OFFSET_BITS) - 1,
        **_arrays(params.onchip_words),
        **{
            f"OP_{name.split('.')[1].upper()}": code
            for name, code in d5005.OPCODES.items()
            if name not in _EXPERT_OPCODES or "experts" in features
        },
        **_feature_constants(features),
        **(_route_at(params.onchip_words) if "experts" in features else {}),
    }


_EXPERT_OPCODES = ("d5005.route", "d5005.expert_sum")  # an engine with `experts` has them


def _route_at(onchip_words: int) -> dict[str, int]:
    """Where, on a device without aoc, the route registers sit in the scratch: after the on-chip arrays (they are
    kept from a run's launch to the next, as the arrays are)."""
    at = sum(d5005.array_words(onchip_words, a) for a in d5005.ARRAYS)
    assert at + d5005.TOP_K_MAX <= onchip_words, "the arrays leave no room for the route registers"
    return {"ROUTE_AT": at}


def _arrays(onchip_words: int) -> dict[str, int]:
    """Each on-chip array's id, its words and (on a device without aoc, where the arrays share one scratch buffer)
    where it starts in the scratch."""
    found, at = {}, 0
    for array in d5005.ARRAYS:
        words = d5005.array_words(onchip_words, array)
        found |= {f"ARRAY_{array.upper()}": d5005.ARRAY_IDS[array], f"{array.upper()}_WORDS": words}
        found[f"{array.upper()}_AT"] = at
        at += words
    return found


def engine_source(identity: str, params: d5005.EngineParams, features: frozenset[str] = frozenset()) -> str:
    """The engine's OpenCL C for `params` with the optional parts `features`, its first line the identity line of
    the program it was emitted for."""
    unknown = set(features) - set(FEATURES)
    assert not unknown, unknown
    defines = "\n".join(f"#define {name} {value}" for name, value in engine_constants(params, features).items())
    about = (
        f"// D5005 decode engine: {params.clock_mhz} MHz, {params.burst_bytes}-byte bursts, vector width"
        f" {params.vector_width}, {params.mac_lanes} MAC lanes, {params.onchip_words} on-chip words, {params.weights}"
        f" weights and KV cache; {d5005.BANKS} bank readers and a compute kernel"
    )
    return f"// {identity}\n{about}\n{defines}\n{_body(frozenset(features))}"


_TEMPLATE = r"""
/* ---- Intel's FPGA SDK for OpenCL, or any other OpenCL device (PoCL's CPU device here) ---------------------- */
#if defined(INTELFPGA_CL)
#pragma OPENCL EXTENSION cl_intel_channels : enable
#define PRAGMA(x) _Pragma(#x)
#define UNROLL(n) PRAGMA(unroll n)
#define IVDEP PRAGMA(ivdep)
#define IVDEP_SAFELEN(n) PRAGMA(ivdep safelen(n))
#define TASK __attribute__((max_global_work_dim(0))) __attribute__((uses_global_work_offset(0))) __kernel
#define BANK_ARG(n) __global __attribute__((buffer_location("DDR"))) bank_word_t *restrict bank##n
#define ONCHIP __local
#define SCRATCH_ARG
#define BANKED(n) __attribute__((numbanks(n), bankwidth(4)))
#else
#define UNROLL(n)
#define IVDEP
#define IVDEP_SAFELEN(n)
#define TASK __kernel
#define BANK_ARG(n) __global bank_word_t *restrict bank##n
#define ONCHIP __global
#define SCRATCH_ARG __global float *restrict scratch,
#define BANKED(n)
#endif

#define OV (BURST_BYTES / 4)               /* float32 words of one bank word: the on-chip routines' width */
#define CPW (BURST_BYTES / CACHE_BYTES)    /* cache elements in one bank word */
#define WORDS(n, bytes) (((n) * (bytes) + BURST_BYTES - 1) / BURST_BYTES)
#define SELECT(c, a, b) ((c) ? (a) : (b))
#define ROPE_WORDS (ROW_WORDS_MAX * BURST_BYTES / 2)
#define QUADS_PER_WORD (OV / BANKS)    /* rows of four whose matvec results fill a bank word of floats */

typedef struct { uint u[BURST_BYTES / 4]; } bank_word_t; /* one 512-bit burst of a DDR4 bank */

/* The channels from the bank readers to the compute kernel: Intel channels on the card. On another device, with
   D5005_RINGS defined (the host's channel path), each is a ring of CHANNEL_DEPTH words in global memory, with the
   count of words its reader has written and the count the compute kernel has taken: the five kernels run at once,
   a reader waits while its ring is full and the compute kernel while one it reads is empty, so the words move in
   the card's order through channels of the card's depth. Without it, each is an ordered buffer that a reader's
   launch fills and the compute launch after it drains, in the same order. */
#if defined(INTELFPGA_CL)
channel bank_word_t bank_words[BANKS] __attribute__((depth(CHANNEL_DEPTH)));${route_channel}
typedef struct { uint unused; } channels_t;
typedef struct { uint unused; } stream_t;
#define READ_BANK(ch, b) read_channel_intel(bank_words[b])
#define WRITE_BANK(s, b, v) write_channel_intel(bank_words[b], (v))
#define FIFO_IN_ARGS
#define FIFO_OUT_ARGS
#else
#if defined(D5005_RINGS)
typedef struct {
    __global const bank_word_t *fifo[BANKS];
    __global volatile uint *sent[BANKS];
    __global volatile uint *taken_count[BANKS];
    uint taken[BANKS];
} channels_t;
typedef struct {
    __global bank_word_t *fifo;
    __global volatile uint *count;
    __global volatile uint *taken;
    uint sent;
} stream_t;
inline bank_word_t read_ring(channels_t *ch, uint b) {
    uint at = ch->taken[b];
    while (atomic_add(ch->sent[b], 0u) == at) {}
    bank_word_t word = ch->fifo[b][at % CHANNEL_DEPTH];
    ch->taken[b] = at + 1;
    atomic_xchg(ch->taken_count[b], at + 1);
    return word;
}
inline void write_ring(stream_t *s, bank_word_t word) {
    while (s->sent - atomic_add(s->taken, 0u) >= CHANNEL_DEPTH) {}
    s->fifo[s->sent % CHANNEL_DEPTH] = word;
    s->sent++;
    atomic_xchg(s->count, s->sent);
}
#define READ_BANK(ch, b) read_ring((ch), (b))
#define WRITE_BANK(s, b, v) write_ring((s), (v))
#define FIFO_IN_ARGS , __global const bank_word_t *restrict fifo0, __global const bank_word_t *restrict fifo1, \
    __global const bank_word_t *restrict fifo2, __global const bank_word_t *restrict fifo3, \
    __global volatile uint *sent0, __global volatile uint *sent1, __global volatile uint *sent2, \
    __global volatile uint *sent3, __global volatile uint *taken0, __global volatile uint *taken1, \
    __global volatile uint *taken2, __global volatile uint *taken3
#define FIFO_OUT_ARGS , __global bank_word_t *restrict fifo, __global volatile uint *sent, __global volatile uint *taken
#define STREAM_OPEN(s) s.fifo = fifo; s.count = sent; s.taken = taken; s.sent = 0
#define STREAM_CLOSE(s)
#define CHANNELS_OPEN(ch) \
    ch.sent[0] = sent0; ch.sent[1] = sent1; ch.sent[2] = sent2; ch.sent[3] = sent3; \
    ch.taken_count[0] = taken0; ch.taken_count[1] = taken1; ch.taken_count[2] = taken2; ch.taken_count[3] = taken3
#else
typedef struct { __global const bank_word_t *fifo[BANKS]; uint taken[BANKS]; } channels_t;
typedef struct { __global bank_word_t *fifo; uint sent; } stream_t;
#define READ_BANK(ch, b) ((ch)->fifo[b][(ch)->taken[b]++])
#define WRITE_BANK(s, b, v) ((s)->fifo[(s)->sent++] = (v))
#define FIFO_IN_ARGS , __global const bank_word_t *restrict fifo0, __global const bank_word_t *restrict fifo1, \
    __global const bank_word_t *restrict fifo2, __global const bank_word_t *restrict fifo3
#define FIFO_OUT_ARGS , __global bank_word_t *restrict fifo, __global uint *restrict sent
#define STREAM_OPEN(s) s.fifo = fifo; s.sent = 0
#define STREAM_CLOSE(s) sent[0] = s.sent
#define CHANNELS_OPEN(ch)
#endif
#endif

#if WEIGHT_BYTES == 2
/* bf16: the upper half of a float32, two to a 32-bit lane of the word */
#define WEIGHT_AT(word, e) as_float(((e) & 1) ? ((word).u[(e) >> 1] & 0xffff0000u) : ((word).u[(e) >> 1] << 16))
#else
#define WEIGHT_AT(word, e) as_float((word).u[e])
#endif
#define CACHE_AT(word, e) WEIGHT_AT(word, e)
#define F32_AT(word, e) as_float((word).u[e])
${stored_helpers}
/* What the cache holds of a value: bf16 rounded to nearest even, or the float32 itself. */
inline float cached(float v) {
#if CACHE_BYTES == 2
    uint bits = as_uint(v);
    return as_float(((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16) << 16);
#else
    return v;
#endif
}

/* ==== the bank readers: one kernel per DDR4 bank, each streaming its rows of every region in 512-bit words ==== */

/* routine read_embed_row */
inline void read_embed_row(stream_t *s, __global const bank_word_t *bank, const uint b, const uint16 w, uint token) {
    uint cols = w.s5, row = token - 1;
    uint words = SELECT(row % BANKS == b, ${row_words}, 0);
    uint start = w.s6 + (row / BANKS) * (w.s7 / BURST_BYTES);
    /* loop read_embed_row.words */
    for (uint c = 0; c < words; c++) WRITE_BANK(s, b, bank[start + c]);
}

/* routine read_matvec */
inline void read_matvec(stream_t *s, __global const bank_word_t *bank, const uint b, const uint16 w) {
    uint rows = w.s4, cols = w.s5, stride = w.s7 / BURST_BYTES;
    uint words = ${row_words};
    uint mine = (rows + BANKS - 1 - b) / BANKS;${read_matvec_bias}${read_matvec_first}${read_matvec_expert}
    uint i = 0, c = 0;
    /* loop read_matvec.words */
    for (uint n = 0; n < mine * words; n++) {
        WRITE_BANK(s, b, bank[${read_matvec_base} + i * stride + c]);
        c++;
        if (c == words) { c = 0; i++; }
    }
}

/* routine read_rms_norm */
inline void read_rms_norm(stream_t *s, __global const bank_word_t *bank, const uint b, const uint16 w) {
    uint words = SELECT(b == 0, WORDS(w.s5, WEIGHT_BYTES), 0);
    /* loop read_rms_norm.words */
    for (uint c = 0; c < words; c++) WRITE_BANK(s, b, bank[w.s6 + c]);
}

/* routine read_rope */
inline void read_rope(stream_t *s, __global const bank_word_t *bank, const uint b, const uint16 w, uint position) {
    uint row = position - 1;
    uint words = SELECT(row % BANKS == b, 2 * WORDS(${read_rope_half}, 4), 0);
    uint start = w.s6 + (row / BANKS) * (w.s7 / BURST_BYTES);
    /* loop read_rope.words */
    for (uint c = 0; c < words; c++) WRITE_BANK(s, b, bank[start + c]);${read_rope_norm}
}

/* Head h's positions 1..position-1 of a cache, in this bank: rows h * ctx + t with (h * ctx + t) % BANKS == b,
   each row's key words then its value words (`row_words` each), in the order the compute kernel takes them. */
/* routine read_attention */
inline void read_attention(stream_t *s, __global const bank_word_t *bank, const uint b, const uint16 w,
                           uint position) {
    uint kv_heads = w.sa${count_mask}, ctx = w.sc, past = position - 1, stride = w.s7 / BURST_BYTES;
    uint row_words = WORDS(w.sb, CACHE_BYTES);${read_window}
    /* loop read_attention.kv_heads */
    for (uint h = 0; h < kv_heads; h++) {
        uint first = ${read_first};
        uint mine = SELECT(past > first, (past - first + BANKS - 1) / BANKS, 0);
        uint row = (h * ctx + first) / BANKS;
        uint i = 0, c = 0;
        /* loop read_attention.rows */
        for (uint n = 0; n < mine * 2 * row_words; n++) {
            uint line = (row + i) * stride;
            WRITE_BANK(s, b, bank[SELECT(c < row_words, w.s6 + line + c, w.s8 + line + c - row_words)]);
            c++;
            if (c == 2 * row_words) { c = 0; i++; }
        }
    }
}

inline void read_bank(stream_t *s, __global const bank_word_t *bank, const uint b, __global const uint16 *program,
                      uint first, uint count, uint token, uint position) {
    for (uint pc = first; pc < first + count; pc++) {
        const uint16 w = program[pc];
        switch (w.s0) {
        case OP_EMBED_ROW: read_embed_row(s, bank, b, w, token); break;
        case OP_MATVEC: read_matvec(s, bank, b, w); break;
        case OP_RMS_NORM: read_rms_norm(s, bank, b, w); break;
        case OP_ROPE: read_rope(s, bank, b, w, position); break;
        case OP_ATTENTION: read_attention(s, bank, b, w, position); break;${read_route_case}
        default: break;
        }
    }
}

#if defined(INTELFPGA_CL)
#define READER(n) \
TASK void d5005_read_bank##n(__global const uint16 *restrict program, const uint first, const uint count, \
                             BANK_ARG(n), const uint token, const uint position) { \
    stream_t s; read_bank(&s, bank##n, n, program, first, count, token, position); }
#else
#define READER(n) \
TASK void d5005_read_bank##n(__global const uint16 *restrict program, const uint first, const uint count, \
                             BANK_ARG(n), const uint token, const uint position FIFO_OUT_ARGS) { \
    stream_t s; STREAM_OPEN(s); \
    read_bank(&s, bank##n, n, program, first, count, token, position); STREAM_CLOSE(s); }
#endif
READER(0)
READER(1)
READER(2)
READER(3)

/* ==== the compute kernel: one routine per opcode, fed by the four bank channels at once ===================== */

/* The on-chip arrays, one a kind of buffer, each banked a float32 word a bank over a bank word (OV banks): a
   buffer field of an instruction word holds its array's id above ARRAY_SHIFT and its offset in bank words below,
   so every buffer starts in bank 0 and a routine's address is (offset * OV + k): bank k % OV, known when the
   engine is built wherever k moves by whole bank words. A run of OV words at an address that is not (a head of
   the attention's, a half of RoPE's) is taken a word from each bank at once: bank e holds lane
   (e - shift) % OV of it, in bank word (address / OV) + (e < shift); the lanes are then rotated into place. */

/* routine embed_row */
inline void embed_row(ONCHIP float *restrict residual, channels_t *ch, const uint16 w, uint token) {
    uint cols = w.s5, dst = (w.s1 & OFFSET_MASK) * OV, bank = (token - 1) % BANKS;
    uint words = ${row_words};${embed_scale_let}${embed_stored_let}
    /* loop embed_row.words */
    for (uint c = 0; c < words; c++) {
        bank_word_t word;
        UNROLL(BANKS)
        for (uint b = 0; b < BANKS; b++) {
            if (b == bank) word = READ_BANK(ch, b);
        }${embed_lanes}
    }
}

/* Rows 4i .. 4i+3 stream from the four banks at once, one word of each a cycle; each row's sum runs through a
   shift register of SHIFT_DEPTH partial sums, so no floating-point add waits on the one before it. The totals
   gather in a bank word of results, stored at once every QUADS_PER_WORD rows of four (a store a bank). */
/* routine matvec */
inline void matvec(ONCHIP float *restrict outputs, ONCHIP float *restrict inputs, ONCHIP float *restrict attended,
                   __local float *restrict vector,${matvec_params} channels_t *ch, const uint16 w) {
    uint rows = w.s4, cols = w.s5, dst = (w.s1 & OFFSET_MASK) * OV, src = ${matvec_src};
    uint from = w.s2 >> ARRAY_SHIFT;
    uint words = ${row_words};
    uint quads = (rows + BANKS - 1) / BANKS;${matvec_stored_let}
    /* loop matvec.load */
    for (uint c = 0; c < ${matvec_span}; c += OV) {
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            float v = 0.0f;
            if (c + e < cols) v = from == ARRAY_ATTENDED ? attended[src + c + e] : inputs[src + c + e];
            vector[c + e] = v;
        }
    }${matvec_bias_load}${matvec_prior_load}
    float out[OV];${matvec_scales}
    /* loop matvec.rows */
    for (uint i = 0; i < quads; i++) {
        float shift[BANKS][SHIFT_DEPTH + 1];
        UNROLL(BANKS)
        for (uint b = 0; b < BANKS; b++) {
${matvec_clear}
        }
        /* loop matvec.words */
        for (uint c = 0; c < words; c++) {${matvec_place}
            UNROLL(BANKS)
            for (uint b = 0; b < BANKS; b++) {
                float sum = 0.0f;
                if (i * BANKS + b < rows) {
                    bank_word_t word = READ_BANK(ch, b);${matvec_stored}
                    UNROLL(VECTOR_WIDTH)
                    for (uint e = 0; e < VECTOR_WIDTH; e++) sum += WEIGHT_AT(word, e) * vector[c * VECTOR_WIDTH + e];
${matvec_stored_end}                }
${matvec_add}
            }
        }
        UNROLL(BANKS)
        for (uint b = 0; b < BANKS; b++) {
${matvec_total}
            out[(i % QUADS_PER_WORD) * BANKS + b] = total;
        }
        if (i % QUADS_PER_WORD == QUADS_PER_WORD - 1 || i == quads - 1) {
            UNROLL(OV)
            for (uint e = 0; e < OV; e++) {
                uint k = (i / QUADS_PER_WORD) * OV + e;
                if (k < rows) outputs[dst + k] = out[e]${matvec_bias_add}${matvec_accumulate};
            }
        }
    }
}

/* routine rms_norm */
inline void rms_norm(ONCHIP float *restrict inputs, ONCHIP float *restrict residual,${rms_norm_param} channels_t *ch,
                     const uint16 w) {
    uint n = w.s5, dst = (w.s1 & OFFSET_MASK) * OV, src = (w.s2 & OFFSET_MASK) * OV;
    uint words = WORDS(n, WEIGHT_BYTES);${rms_norm_let}
    float shift[SHIFT_DEPTH + 1];
${rms_norm_clear}
    /* loop rms_norm.squares */
    for (uint c = 0; c < n; c += OV) {
        float sum = 0.0f;
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            float v = SELECT(c + e < n, ${rms_norm_square_src}, 0.0f);
            sum += v * v;
        }
${rms_norm_add}
    }
${rms_norm_total}
    float scale = 1.0f / sqrt(squares * (1.0f / (float)n) + as_float(w.sd));
    IVDEP
    /* loop rms_norm.scale */
    for (uint c = 0; c < words; c++) {
        bank_word_t word = READ_BANK(ch, 0);
        UNROLL(VECTOR_WIDTH)
        for (uint e = 0; e < VECTOR_WIDTH; e++) {
            uint k = c * VECTOR_WIDTH + e;
${rms_norm_store}
        }
    }
}

/* The table's row for the position holds cos of each half-frequency, then sin, each half padded to whole bank
   words: word c lands in cosines (c < half_words) or sines, lane e in bank e of its array, a bank known when the
   engine is built. Each head's halves are runs of OV words at a run-time offset (head * head_dim, + mid): each
   taken and stored a word from each bank at once. */
/* routine rope */
inline void rope(ONCHIP float *restrict rotated, ONCHIP float *restrict outputs, __local float *restrict cosines,
                 __local float *restrict sines,${rope_norm_param} channels_t *ch, const uint16 w, uint position) {
    uint head_dim = w.sb, ${rope_dims}, width = w.se;
    uint dst = (w.s1 & OFFSET_MASK) * OV, src = (w.s2 & OFFSET_MASK) * OV;${rope_inputs_let}
    uint bank = (position - 1) % BANKS;
    uint half_words = WORDS(mid, 4);
    uint words = 2 * half_words;
    /* loop rope.table */
    for (uint c = 0; c < words; c++) {
        bank_word_t word;
        UNROLL(BANKS)
        for (uint b = 0; b < BANKS; b++) {
            if (b == bank) word = READ_BANK(ch, b);
        }
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {  /* one store a lane: the word is taken from its bank first */
            if (c < half_words) cosines[c * OV + e] = F32_AT(word, e);
            else sines[(c - half_words) * OV + e] = F32_AT(word, e);
        }
    }
    uint heads = width / head_dim;${rope_norm_load}
    /* loop rope.heads */
    for (uint head = 0; head < heads; head++) {${rope_squares}
        IVDEP
        /* loop rope.rotate */
        for (uint c = 0; c < mid; c += OV) {
            uint first_at = src + head * head_dim + c, second_at = first_at + mid;
            uint first_word = first_at / OV, first_shift = first_at % OV;
            uint second_word = second_at / OV, second_shift = second_at % OV;
            uint to_at = dst + head * head_dim + c, to2_at = to_at + mid;
            uint to_word = to_at / OV, to_shift = to_at % OV, to2_word = to2_at / OV, to2_shift = to2_at % OV;
${rope_norm_at}            float firsts[OV], seconds[OV], turned_first[OV], turned_second[OV];
            UNROLL(OV)
            for (uint e = 0; e < OV; e++) {  /* bank e's word of each half */
                firsts[e] = 0.0f;
                seconds[e] = 0.0f;
                if (c + (e + OV - first_shift) % OV < mid)
                    firsts[e] = ${rope_first_load};
                if (c + (e + OV - second_shift) % OV < mid)
                    seconds[e] = ${rope_second_load};${rope_norm_runs}
            }
            UNROLL(OV)
            for (uint l = 0; l < OV; l++) {
                float first = firsts[(l + first_shift) % OV], second = seconds[(l + second_shift) % OV];
${rope_norm_apply}                float cosine = cosines[c + l], sine = sines[c + l];
                turned_first[l] = first * cosine + second * (-sine);
                turned_second[l] = second * cosine + first * sine;
            }
            UNROLL(OV)
            for (uint e = 0; e < OV; e++) {  /* one store a bank for each half */
                uint lane = (e + OV - to_shift) % OV, lane2 = (e + OV - to2_shift) % OV;
                if (c + lane < mid) rotated[(to_word + (e < to_shift)) * OV + e] = turned_first[lane];
                if (c + lane2 < mid) rotated[(to2_word + (e < to2_shift)) * OV + e] = turned_second[lane2];
            }
        }${rope_pass}
    }
}

/* Head h's key (or value) at the position goes to cache row h * ctx + position - 1, in the cache's precision:
   each bank word of it a run of CPW elements, CPW / OV runs of OV words at a run-time offset. */
/* routine cache_write */
inline void cache_write(ONCHIP float *restrict outputs, ONCHIP float *restrict rotated,
                        __global bank_word_t *restrict bank0, __global bank_word_t *restrict bank1,
                        __global bank_word_t *restrict bank2, __global bank_word_t *restrict bank3, const uint16 w,
                        uint position) {
    uint head_dim = w.s5, kv_heads = w.sa, ctx = w.s4 / kv_heads, src = (w.s2 & OFFSET_MASK) * OV;
    uint from = w.s2 >> ARRAY_SHIFT;
    uint words = WORDS(head_dim, CACHE_BYTES);
    /* loop cache_write.heads */
    for (uint h = 0; h < kv_heads; h++) {
        uint row = h * ctx + position - 1, bank = row % BANKS;
        uint line = w.s6 + (row / BANKS) * (w.s7 / BURST_BYTES);
        /* loop cache_write.words */
        for (uint c = 0; c < words; c++) {
            float v[CPW];
${cache_run}
            bank_word_t word;
            UNROLL(BURST_BYTES / 4)
            for (uint u = 0; u < BURST_BYTES / 4; u++) {
#if CACHE_BYTES == 2
                word.u[u] = (as_uint(cached(v[2 * u])) >> 16) | ((as_uint(cached(v[2 * u + 1])) >> 16) << 16);
#else
                word.u[u] = as_uint(v[u]);
#endif
            }
            /* each bank its own store site: no global pointer chosen at run time */
            if (bank == 0) bank0[line + c] = word;
            if (bank == 1) bank1[line + c] = word;
            if (bank == 2) bank2[line + c] = word;
            if (bank == 3) bank3[line + c] = word;
        }
    }
}

/* Causal grouped-query attention in one pass over the cache, one KV head at a time, with an online softmax: each
   bank word of a key row meets the group's queries as it streams in, the row's score is complete at its last key
   word, and the row's value words, which follow it from the same bank, are weighted at once. Rows of four
   positions (one from each bank) rotate through SHIFT_DEPTH slots, each with its own running maximum and sum
   (shift registers) and value accumulator (`acc`), so an accumulator is updated again only SLOT_DISTANCE or more
   iterations later. The slots and the position itself (its key and value on chip, what the step's cache_write
   stored) are merged at the end; nothing goes through a scratch buffer. The queries, the position's key and value
   and each query head's output are runs of a head's words at a run-time offset, each bank word of CPW elements
   taken (or stored) CPW / OV words from each bank at once. */
/* routine attention */
inline void attention(ONCHIP float *restrict attended, ONCHIP float *restrict rotated,
                      ONCHIP float *restrict outputs, __local float *restrict queries, __local float *restrict acc,
                      channels_t *ch, const uint16 w, uint position) {
    uint heads = w.s9${count_mask}, kv_heads = w.sa${count_mask}, head_dim = w.sb, ctx = w.sc;
    uint group = heads / kv_heads, past = position - 1;${attention_window}
    uint quads = ${attention_quads};
    uint row_words = WORDS(head_dim, CACHE_BYTES);
    uint dst = (w.s1 & OFFSET_MASK) * OV, query = (w.s2 & OFFSET_MASK) * OV;
    uint key = (w.se & OFFSET_MASK) * OV, value = (w.sf & OFFSET_MASK) * OV;
    float scale = as_float(w.sd);${softcap_let}
    bank_word_t blank; /* the word of a bank that has no row this time: zeros, so its products are 0 */
    UNROLL(BURST_BYTES / 4)
    for (uint u = 0; u < BURST_BYTES / 4; u++) blank.u[u] = 0;
    /* loop attention.kv_heads */
    for (uint h = 0; h < kv_heads; h++) {
        uint base = (h * ctx) % BANKS;
        float here[GROUP_MAX][SHIFT_DEPTH + 1];
        UNROLL(GROUP_MAX)
        for (uint g = 0; g < GROUP_MAX; g++) {
${current_clear}
        }
        /* the group's queries on chip, a bank word of each a cycle, and their products with the position's key */
        /* loop attention.queries */
        for (uint i = 0; i < row_words; i++) {
            float k_here[CPW];
${key_run}
            UNROLL(GROUP_MAX)
            for (uint g = 0; g < GROUP_MAX; g++) {
                float q_here[CPW];
${query_run}
                float sum = 0.0f;
                UNROLL(CPW)
                for (uint e = 0; e < CPW; e++) {
                    queries[(i * GROUP_MAX + g) * CPW + e] = q_here[e];
                    sum += q_here[e] * k_here[e];
                }
${current_add}
            }
        }
        float most[GROUP_MAX][SHIFT_DEPTH + 1], mass[GROUP_MAX][SHIFT_DEPTH + 1];
        float kpart[BANKS][GROUP_MAX][ROW_WORDS_MAX], p[GROUP_MAX][BANKS], fade[GROUP_MAX];
        UNROLL(GROUP_MAX)
        for (uint g = 0; g < GROUP_MAX; g++) {
            UNROLL(SHIFT_DEPTH + 1)
            for (uint d = 0; d <= SHIFT_DEPTH; d++) {
                most[g][d] = -INFINITY;
                mass[g][d] = 0.0f;
            }
        }
        uint q = 0, j = 0, slot = 0;
        IVDEP_SAFELEN(SLOT_DISTANCE)
        /* loop attention.rows */
        for (uint n = 0; n < quads * 2 * row_words; n++) {
            bank_word_t word[BANKS];
            uint valid[BANKS];
            UNROLL(BANKS)
            for (uint b = 0; b < BANKS; b++) {
${attention_valid}
                word[b] = blank;
                if (valid[b]) word[b] = READ_BANK(ch, b);
            }
            /* each bank's word times the group's queries on a key word, times the row's weights on a value word:
               the two never meet in one iteration, so they share one multiplier a lane; a key word's partial dot
               products shift in, a value word's products sum over the banks */
            float sums[GROUP_MAX][CPW];
            UNROLL(GROUP_MAX)
            for (uint g = 0; g < GROUP_MAX; g++) {
                float qv[CPW];
                UNROLL(CPW)
                for (uint e = 0; e < CPW; e++) {
                    qv[e] = queries[((j % ROW_WORDS_MAX) * GROUP_MAX + g) * CPW + e];
                    sums[g][e] = 0.0f;
                }
                UNROLL(BANKS)
                for (uint b = 0; b < BANKS; b++) {
                    float dot = 0.0f;
                    UNROLL(CPW)
                    for (uint e = 0; e < CPW; e++) {
                        float product = CACHE_AT(word[b], e) * SELECT(j < row_words, qv[e], p[g][b]);
                        dot += product;
                        sums[g][e] += product;
                    }
                    if (j < row_words) {
                        UNROLL(ROW_WORDS_MAX - 1)
                        for (uint r = 0; r < ROW_WORDS_MAX - 1; r++) kpart[b][g][r] = kpart[b][g][r + 1];
                        kpart[b][g][ROW_WORDS_MAX - 1] = dot;
                    }
                }
            }
            /* the row's last key word: its four scores, and the slot's running maximum and sum */
            if (j == row_words - 1) {
                UNROLL(GROUP_MAX)
                for (uint g = 0; g < GROUP_MAX; g++) {
                    float s[BANKS], newest = -INFINITY;
                    UNROLL(BANKS)
                    for (uint b = 0; b < BANKS; b++) {
                        float dot = 0.0f;
                        UNROLL(ROW_WORDS_MAX)
                        for (uint r = 0; r < ROW_WORDS_MAX; r++)
                            dot += SELECT(r + row_words >= ROW_WORDS_MAX, kpart[b][g][r], 0.0f);
                        s[b] = ${score_row};
                        newest = fmax(newest, SELECT(valid[b], s[b], -INFINITY));
                    }
                    most[g][SHIFT_DEPTH] = fmax(most[g][0], newest);
                    fade[g] = exp(most[g][0] - most[g][SHIFT_DEPTH]);
                    float sum = 0.0f;
                    UNROLL(BANKS)
                    for (uint b = 0; b < BANKS; b++) {
                        p[g][b] = SELECT(valid[b], exp(s[b] - most[g][SHIFT_DEPTH]), 0.0f);
                        sum += p[g][b];
                    }
                    mass[g][SHIFT_DEPTH] = mass[g][0] * fade[g] + sum;
                    UNROLL(SHIFT_DEPTH)
                    for (uint d = 0; d < SHIFT_DEPTH; d++) {
                        most[g][d] = most[g][d + 1];
                        mass[g][d] = mass[g][d + 1];
                    }
                }
            }
            /* a value word: the slot's accumulator, rescaled to its new maximum, takes the row's weighted values */
            if (j >= row_words) {
                uint vi = j - row_words;
                UNROLL(GROUP_MAX)
                for (uint g = 0; g < GROUP_MAX; g++) {
                    UNROLL(CPW)
                    for (uint e = 0; e < CPW; e++) {
                        uint at = ((slot * ROW_WORDS_MAX + vi) * GROUP_MAX + g) * CPW + e;
                        acc[at] = SELECT(q < SHIFT_DEPTH, 0.0f, acc[at] * fade[g]) + sums[g][e];
                    }
                }
            }
            j++;
            if (j == 2 * row_words) { j = 0; q++; slot = (slot + 1) % SHIFT_DEPTH; }
        }
        /* the slots merged with the position itself: each one's weight under the common maximum */
        float weight[GROUP_MAX][SHIFT_DEPTH], own[GROUP_MAX];
        UNROLL(GROUP_MAX)
        for (uint g = 0; g < GROUP_MAX; g++) {
${current_total}
            float s = ${score_own}, top = s;
            UNROLL(SHIFT_DEPTH)
            for (uint d = 0; d < SHIFT_DEPTH; d++) top = fmax(top, most[g][d]);
            float total = exp(s - top);
            UNROLL(SHIFT_DEPTH)
            for (uint d = 0; d < SHIFT_DEPTH; d++) {
                weight[g][d] = exp(most[g][d] - top);
                total += mass[g][d] * weight[g][d];
            }
            UNROLL(SHIFT_DEPTH)
            for (uint d = 0; d < SHIFT_DEPTH; d++) weight[g][d] = weight[g][d] / total;
            own[g] = exp(s - top) / total;
        }
        /* each query head of the group in turn, a bank word of its output an iteration: the accumulators' words
           of every head are read at once (a load a bank) and the head's are kept */
        uint member = 0, piece = 0;
        IVDEP /* the value, the accumulators and the output are different arrays */
        /* loop attention.output */
        for (uint n = 0; n < group * row_words; n++) {
            float v_here[CPW], merged[CPW];
${value_run}
            UNROLL(CPW)
            for (uint e = 0; e < CPW; e++) merged[e] = own[member] * v_here[e];
            UNROLL(SHIFT_DEPTH)
            for (uint r = 0; r < SHIFT_DEPTH; r++) {
                uint slot_at = (((quads + r) % SHIFT_DEPTH) * ROW_WORDS_MAX + piece) * GROUP_MAX * CPW;
                UNROLL(GROUP_MAX)
                for (uint g = 0; g < GROUP_MAX; g++) {
                    UNROLL(CPW)
                    for (uint e = 0; e < CPW; e++) {
                        float held = acc[slot_at + g * CPW + e];
                        if (g == member && quads + r >= SHIFT_DEPTH) merged[e] += held * weight[g][r];
                    }
                }
            }
${output_run}
            piece++;
            if (piece == row_words) { piece = 0; member++; }
        }
    }
}


/* routine silu_mul */
inline void silu_mul(ONCHIP float *restrict inputs, ONCHIP float *restrict outputs, const uint16 w) {
    uint n = w.s4, dst = (w.s1 & OFFSET_MASK) * OV;
    uint gate = (w.s2 & OFFSET_MASK) * OV, up = (w.s3 & OFFSET_MASK) * OV;${gelu_let}
    IVDEP
    /* loop silu_mul.words */
    for (uint c = 0; c < n; c += OV) {
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            if (c + e < n) {
                float g = outputs[gate + c + e];
                inputs[dst + c + e] = ${gated} * outputs[up + c + e];
            }
        }
    }
}

/* routine add */
inline void add(ONCHIP float *restrict residual,${add_param} ONCHIP float *restrict outputs, const uint16 w) {
    uint n = w.s4, dst = (w.s1 & OFFSET_MASK) * OV;
    uint lhs = (w.s2 & OFFSET_MASK) * OV, rhs = (w.s3 & OFFSET_MASK) * OV;${add_let}
    IVDEP
    /* loop add.words */
    for (uint c = 0; c < n; c += OV) {
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            if (c + e < n) residual[dst + c + e] = residual[lhs + c + e] + ${add_rhs};
        }
    }
}

/* The greatest of n words, the first on a tie, through SHIFT_DEPTH running winners; the logits go to the host. */
/* routine argmax */
inline uint argmax(ONCHIP float *restrict outputs, __global float *restrict logits, const uint16 w) {
    uint n = w.s4, src = (w.s2 & OFFSET_MASK) * OV;${argmax_cap_let}
    float value[SHIFT_DEPTH + 1];
    uint index[SHIFT_DEPTH + 1];
    UNROLL(SHIFT_DEPTH + 1)
    for (uint d = 0; d <= SHIFT_DEPTH; d++) { value[d] = -INFINITY; index[d] = 0xffffffffu; }
    /* loop argmax.words */
    for (uint c = 0; c < n; c += OV) {
        float best = -INFINITY;
        uint at = 0xffffffffu;
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            if (c + e < n) {
                float v = outputs[src + c + e];${argmax_cap}
                logits[c + e] = v;
                if (v > best || at == 0xffffffffu) { best = v; at = c + e; }
            }
        }
        uint keep = value[0] >= best && index[0] != 0xffffffffu;
        value[SHIFT_DEPTH] = SELECT(keep, value[0], best);
        index[SHIFT_DEPTH] = SELECT(keep, index[0], at);
        UNROLL(SHIFT_DEPTH)
        for (uint d = 0; d < SHIFT_DEPTH; d++) { value[d] = value[d + 1]; index[d] = index[d + 1]; }
    }
    float best = -INFINITY;
    uint at = 0xffffffffu;
    UNROLL(SHIFT_DEPTH)
    for (uint d = 0; d < SHIFT_DEPTH; d++) {
        if (index[d] != 0xffffffffu && (at == 0xffffffffu || value[d] > best || (value[d] == best && index[d] < at))) {
            best = value[d];
            at = index[d];
        }
    }
    return SELECT(at == 0xffffffffu, 0u, at) + 1;
}
${route_routines}
/* Instructions first .. first + count - 1 of a decode step (token and position from 1); result[0] is the next
   token (from 1) once the step's arg-max has run, logits what it read. */
TASK void d5005_compute(__global const uint16 *restrict program, const uint first, const uint count,
                        BANK_ARG(0), BANK_ARG(1), BANK_ARG(2), BANK_ARG(3), SCRATCH_ARG
                        const uint token, const uint position, __global uint *restrict result,
                        __global float *restrict logits FIFO_IN_ARGS) {
#if defined(INTELFPGA_CL)
    __local float residual[RESIDUAL_WORDS] BANKED(OV);
    __local float inputs[INPUTS_WORDS] BANKED(OV);
    __local float attended[ATTENDED_WORDS] BANKED(OV);
    __local float outputs[OUTPUTS_WORDS] BANKED(OV);
    __local float rotated[ROTATED_WORDS] BANKED(OV);
#else
    __global float *restrict residual = scratch + RESIDUAL_AT, *restrict inputs = scratch + INPUTS_AT;
    __global float *restrict attended = scratch + ATTENDED_AT, *restrict outputs = scratch + OUTPUTS_AT;
    __global float *restrict rotated = scratch + ROTATED_AT;
#endif
    __local float vector[VECTOR_WORDS${vector_pad}] BANKED(OV);${bias_array}${prior_array}
    __local float queries[ROW_WORDS_MAX * GROUP_MAX * CPW] BANKED(GROUP_MAX * CPW);
    __local float cosines[ROPE_WORDS / 2] BANKED(OV);
    __local float sines[ROPE_WORDS / 2] BANKED(OV);${head_norm_array}${route_arrays}
    __local float acc[SHIFT_DEPTH * ROW_WORDS_MAX * GROUP_MAX * CPW] BANKED(GROUP_MAX * CPW);
    channels_t ch;
#if !defined(INTELFPGA_CL)
    ch.fifo[0] = fifo0; ch.fifo[1] = fifo1; ch.fifo[2] = fifo2; ch.fifo[3] = fifo3;
    for (uint b = 0; b < BANKS; b++) ch.taken[b] = 0;
    CHANNELS_OPEN(ch);
#endif
    for (uint pc = first; pc < first + count; pc++) {
        const uint16 w = program[pc];
        switch (w.s0) {
        case OP_EMBED_ROW: embed_row(residual, &ch, w, token); break;
        case OP_MATVEC: matvec(outputs, inputs, attended, vector${matvec_bias_arg}${matvec_prior_arg}, &ch, w); break;
        case OP_RMS_NORM: rms_norm(inputs, residual${rms_norm_arg}, &ch, w); break;
        case OP_ROPE: rope(rotated, outputs, cosines, sines${rope_norm_arg}, &ch, w, position); break;
        case OP_CACHE_WRITE: cache_write(outputs, rotated, bank0, bank1, bank2, bank3, w, position); break;
        case OP_ATTENTION: attention(attended, rotated, outputs, queries, acc, &ch, w, position); break;
        case OP_SILU_MUL: silu_mul(inputs, outputs, w); break;
        case OP_ADD: add(residual, ${add_arg}outputs, w); break;
        case OP_ARGMAX: result[0] = argmax(outputs, logits, w); break;${route_cases}
        default: break;
        }
    }
}
"""


def _shift_clear(register: str, indent: int) -> str:
    """Zero a shift register of SHIFT_DEPTH partial sums (and the slot each step adds into)."""
    at = " " * indent
    return f"{at}UNROLL(SHIFT_DEPTH + 1)\n{at}for (uint d = 0; d <= SHIFT_DEPTH; d++) {register}[d] = 0.0f;"


def _shift_add(register: str, value: str, indent: int) -> str:
    """Add `value` into a shift register: the sum it makes is read SHIFT_DEPTH steps later, so no floating-point
    add waits on the one before it."""
    at = " " * indent
    return (
        f"{at}{register}[SHIFT_DEPTH] = {register}[0] + {value};\n{at}UNROLL(SHIFT_DEPTH)\n"
        f"{at}for (uint d = 0; d < SHIFT_DEPTH; d++) {register}[d] = {register}[d + 1];"
    )


def _shift_total(total: str, register: str, indent: int) -> str:
    """`total`, the sum of a shift register's SHIFT_DEPTH partial sums."""
    at = " " * indent
    return (
        f"{at}float {total} = 0.0f;\n{at}UNROLL(SHIFT_DEPTH)\n"
        f"{at}for (uint d = 0; d < SHIFT_DEPTH; d++) {total} += {register}[d];"
    )


def _run_in(read: str, base: str, element: str, valid: str, into: str, indent: int, wrap: str = "") -> str:
    """Take a bank word of CPW elements at float `base` (a run-time offset) into `into`: CPW / OV runs of OV words,
    each a word from every bank at once (bank e holds lane (e - shift) % OV, in bank word base / OV + (e < shift)),
    rotated into place; an element where `valid` (of its index `elem`) does not hold is 0. `read` is the load,
    `ADDRESS` in it its address."""
    at = " " * indent
    address = "(at_word + (e < at_shift)) * OV + e"
    rotated = f"{wrap}(raw[(l + at_shift) % OV])" if wrap else "raw[(l + at_shift) % OV]"
    return "\n".join(
        [
            f"{at}UNROLL(CPW / OV)",
            f"{at}for (uint r = 0; r < CPW / OV; r++) {{",
            f"{at}    uint at = {base} + r * OV;",
            f"{at}    uint at_word = at / OV, at_shift = at % OV;",
            f"{at}    float raw[OV];",
            f"{at}    UNROLL(OV)",
            f"{at}    for (uint e = 0; e < OV; e++) {{  /* one load a bank */",
            f"{at}        uint elem = {element} + r * OV + (e + OV - at_shift) % OV;",
            f"{at}        raw[e] = 0.0f;",
            f"{at}        if ({valid}) raw[e] = {read.replace('ADDRESS', address)};",
            f"{at}    }}",
            f"{at}    UNROLL(OV)",
            f"{at}    for (uint l = 0; l < OV; l++) {into}[r * OV + l] = {rotated};",
            f"{at}}}",
        ]
    )


def _run_out(array: str, base: str, element: str, valid: str, source: str, indent: int) -> str:
    """Store a bank word of CPW elements of `source` at float `base` (a run-time offset) of `array`: CPW / OV runs
    of OV words, bank e taking lane (e - shift) % OV in bank word base / OV + (e < shift), where `valid` holds."""
    at = " " * indent
    return "\n".join(
        [
            f"{at}UNROLL(CPW / OV)",
            f"{at}for (uint r = 0; r < CPW / OV; r++) {{",
            f"{at}    uint at = {base} + r * OV;",
            f"{at}    uint at_word = at / OV, at_shift = at % OV;",
            f"{at}    UNROLL(OV)",
            f"{at}    for (uint e = 0; e < OV; e++) {{  /* one store a bank */",
            f"{at}        uint lane = (e + OV - at_shift) % OV, elem = {element} + r * OV + lane;",
            f"{at}        if ({valid}) {array}[(at_word + (e < at_shift)) * OV + e] = {source}[r * OV + lane];",
            f"{at}    }}",
            f"{at}}}",
        ]
    )


# A matvec's bias (`bias`): bank 0 streams it before its rows (w.se words, at burst w.s8), into the on-chip copy
# `biases` (a store a bank for each of a bank word's floats), and each row's total takes its bias as it is stored
# (a load a bank); a matvec without one (w.se = 0) adds nothing.
_BIAS = {
    "read_matvec_bias": """
    uint bias_words = SELECT(b == 0, WORDS(w.se, WEIGHT_BYTES), 0);
    /* loop read_matvec.bias */
    for (uint c = 0; c < bias_words; c++) WRITE_BANK(s, b, bank[w.s8 + c]);""",
    "matvec_bias_param": " __local float *restrict biases,",
    "matvec_bias_load": """
    uint biased = w.se, bias_words = WORDS(biased, WEIGHT_BYTES);
    /* loop matvec.bias */
    for (uint c = 0; c < bias_words; c++) {
        bank_word_t word = READ_BANK(ch, 0);
        UNROLL(VECTOR_WIDTH)
        for (uint e = 0; e < VECTOR_WIDTH; e++) biases[c * VECTOR_WIDTH + e] = WEIGHT_AT(word, e);
    }""",
    "matvec_bias_add": " + SELECT(biased, biases[k], 0.0f)",
    "bias_array": "\n    __local float biases[BIAS_WORDS] BANKED(OV);",
    "matvec_bias_arg": ", biases",
}


# A sliding window (`window`, w.s3 positions, 0 for none): the earlier rows read are those from `low` =
# position - window on (all of them while the positions so far fit the window), so each bank's reader starts at its
# first row of the window and the compute kernel's pass runs over the rows of four from the one holding `low`; a row
# of four's rows before `low` or from the position on are not valid (no word taken, no weight).
_WINDOW = {
    "read_window": """
    uint window = w.s3, low = SELECT(window != 0 && position > window, position - window, 0);""",
    "read_first": "low + (b + 2 * BANKS - (h * ctx) % BANKS - low % BANKS) % BANKS",
    "attention_window": """
    uint window = w.s3, low = SELECT(window != 0 && position > window, position - window, 0);
    uint start = (low / BANKS) * BANKS;""",
    "attention_quads": "(past - start + BANKS - 1) / BANKS",
    "attention_valid": """                uint row = start + q * BANKS + (b + BANKS - base) % BANKS;
                valid[b] = row >= low && row < past;""",
}
# ... and the same places of the engine without a window.
_UNWINDOWED = {
    "read_window": "",
    "read_first": "(b + BANKS - (h * ctx) % BANKS) % BANKS",
    "attention_window": "",
    "attention_quads": "(past + BANKS - 1) / BANKS",
    "attention_valid": "                valid[b] = q * BANKS + (b + BANKS - base) % BANKS < past;",
}


# A rope that RMS-norms each head first (`head_norm`, w.s9 = 1; Qwen3's query and key norms): bank 0 streams the
# norm's weight after the table's row (head_dim elements at burst w.s8) into `head_weights` (a store a bank for each
# float of a word); each head's squares are summed a bank word of both halves at a time (the rotation's own loads,
# `rope.squares`), and the rotation scales each half by scale * its weights, the second half's weights taken as a
# run at a run-time offset (mid + c: a load a bank) as the heads' halves are.
_HEAD_NORM = {
    "read_rope_norm": """
    uint norm_words = SELECT(b == 0 && w.s9 != 0, WORDS(w.sb, WEIGHT_BYTES), 0);
    /* loop read_rope.norm */
    for (uint c = 0; c < norm_words; c++) WRITE_BANK(s, b, bank[w.s8 + c]);""",
    "rope_norm_param": " __local float *restrict head_weights,",
    "rope_norm_load": """
    uint normed = w.s9, norm_words = SELECT(normed, WORDS(head_dim, WEIGHT_BYTES), 0), squared = SELECT(normed, mid, 0);
    /* loop rope.norm */
    for (uint c = 0; c < norm_words; c++) {
        bank_word_t word = READ_BANK(ch, 0);
        UNROLL(VECTOR_WIDTH)
        for (uint e = 0; e < VECTOR_WIDTH; e++) head_weights[c * VECTOR_WIDTH + e] = WEIGHT_AT(word, e);
    }""",
    "rope_squares": """
        float shift[SHIFT_DEPTH + 1];
${clear}
        /* loop rope.squares */
        for (uint c = 0; c < squared; c += OV) {
            uint first_at = src + head * head_dim + c, second_at = first_at + mid;
            uint first_word = first_at / OV, first_shift = first_at % OV;
            uint second_word = second_at / OV, second_shift = second_at % OV;
            float sum = 0.0f;
            UNROLL(OV)
            for (uint e = 0; e < OV; e++) {  /* bank e's word of each half, as the rotation takes them */
                float first = 0.0f, second = 0.0f;
                if (c + (e + OV - first_shift) % OV < mid) first = outputs[(first_word + (e < first_shift)) * OV + e];
                if (c + (e + OV - second_shift) % OV < mid)
                    second = outputs[(second_word + (e < second_shift)) * OV + e];
                sum += first * first + second * second;
            }
${add}
        }
${total}
        float scale = SELECT(normed, 1.0f / sqrt(squares * (1.0f / (float)head_dim) + as_float(w.sd)), 1.0f);""",
    "rope_norm_at": """            uint norm_word = (mid + c) / OV, norm_shift = (mid + c) % OV;
            float norm_firsts[OV], norm_seconds[OV];
""",
    "rope_norm_runs": """
                norm_firsts[e] = 1.0f;
                norm_seconds[e] = 1.0f;
                if (normed && c + e < mid) norm_firsts[e] = head_weights[c + e];
                if (normed && c + (e + OV - norm_shift) % OV < mid)
                    norm_seconds[e] = head_weights[(norm_word + (e < norm_shift)) * OV + e];""",
    "rope_norm_apply": """                first = first * scale * norm_firsts[l];
                second = second * scale * norm_seconds[(l + norm_shift) % OV];
""",
    "head_norm_array": "\n    __local float head_weights[ROPE_WORDS] BANKED(OV);",
    "rope_norm_arg": ", head_weights",
}
_HEAD_NORM["rope_squares"] = Template(_HEAD_NORM["rope_squares"]).substitute(
    clear=_shift_clear("shift", 8), add=_shift_add("shift", "sum", 12), total=_shift_total("squares", "shift", 8)
)


# A rope that rotates only the first w.sa numbers of each head (`partial_rotary`, Phi-3's partial_rotary_factor):
# its table's rows are over those (mid = w.sa / 2), and the rest of each head is passed through as it is, a bank
# word of floats at a time (`rope.pass`: a run of OV words taken from `outputs` and stored into `rotated` at a
# run-time offset, a load and a store a bank); w.sa = 0 rotates the whole head.
_PARTIAL = {
    "rope_dims": "rotary = SELECT(w.sa != 0, w.sa, head_dim), mid = rotary / 2",
    "read_rope_half": "SELECT(w.sa != 0, w.sa, w.sb) / 2",
    "rope_pass": """
        uint rest = head_dim - rotary;
        IVDEP
        /* loop rope.pass */
        for (uint c = 0; c < rest; c += OV) {
            uint from_at = src + head * head_dim + rotary + c, to_at = dst + head * head_dim + rotary + c;
            uint from_word = from_at / OV, from_shift = from_at % OV, to_word = to_at / OV, to_shift = to_at % OV;
            float kept[OV];
            UNROLL(OV)
            for (uint e = 0; e < OV; e++) {  /* bank e's word of the run */
                kept[e] = 0.0f;
                if (c + (e + OV - from_shift) % OV < rest) kept[e] = outputs[(from_word + (e < from_shift)) * OV + e];
            }
            UNROLL(OV)
            for (uint e = 0; e < OV; e++) {  /* one store a bank */
                uint lane = (e + OV - to_shift) % OV;
                if (c + lane < rest) rotated[(to_word + (e < to_shift)) * OV + e] = kept[(lane + from_shift) % OV];
            }
        }""",
}
_WHOLE = {"rope_dims": "mid = head_dim / 2", "read_rope_half": "w.sb / 2", "rope_pass": ""}


# A mixture of experts (`experts`): a route (w.se experts, top_k in w.s5, renormalize in w.s9) turns the router's
# logits into probabilities, chooses the top_k and keeps their weights in the route registers (`route_weights`, in
# ascending expert index) and their ids in a bank word of every bank at its region (w.s6); each bank's reader of an
# expert's matvec (w.s9 its slot + 1) reads the chosen id from its own bank (w.sa) and streams that expert's rows,
# w.sc bank words from one expert's to the next's (at most w.sd experts: an id past them streams expert 0). On the
# card the compute kernel signals each reader through `routed` once the ids are in board memory, and a reader waits
# for it at the route; with D5005_RINGS the compute kernel sets the second word of each ring's count of words taken
# to the route's pc + 1, which each reader waits for at the route; with ordered buffers the host ends a run of
# instructions at each route, so the next run's readers find the ids written. An expert_sum (its slot in w.s9) adds
# its slot's weight times the expert's output into the result (slot 0 writes it).
_EXPERTS = {
    "route_channel": "\nchannel uint routed[BANKS] __attribute__((depth(1)));",
    "read_matvec_expert": """
    uint expert = 0;
    if (w.s9 != 0u) {  /* an expert's matvec: the id the route chose for its slot, from this bank's copy */
        uint slot = (w.s9 - 1u) & (TOP_K_MAX - 1u);
        /* volatile: aoc gives the load no cache, so it sees what the route wrote during this launch */
        uint chosen = ((__global volatile const uint *)bank)[(w.sa + slot / OV) * OV + slot % OV];
        expert = SELECT(chosen < w.sd, chosen, 0u);
    }""",
    "read_route_case": """
        case OP_ROUTE:
#if defined(INTELFPGA_CL)
            (void)read_channel_intel(routed[b]); /* the route's ids are in board memory */
            mem_fence(CLK_GLOBAL_MEM_FENCE | CLK_CHANNEL_MEM_FENCE);
#elif defined(D5005_RINGS)
            while (atomic_add(s->taken + 1, 0u) <= pc) {} /* until the compute kernel has run this route */
#endif
            break;""",
    "route_arrays": """
    __local float probs[EXPERTS_MAX] BANKED(OV);
#if defined(INTELFPGA_CL)
    __local float route_weights[TOP_K_MAX];
#else
    __global float *restrict route_weights = scratch + ROUTE_AT; /* kept from one launch to the next */
#endif""",
    "route_cases": """
        case OP_ROUTE:
            route(outputs, probs, route_weights, bank0, bank1, bank2, bank3, w);
#if defined(D5005_RINGS)
            mem_fence(CLK_GLOBAL_MEM_FENCE);
            for (uint b = 0; b < BANKS; b++) atomic_xchg(ch.taken_count[b] + 1, pc + 1); /* the readers may go on */
#endif
            break;
        case OP_EXPERT_SUM: expert_sum(attended, outputs, route_weights, w); break;""",
    "route_routines": r"""
/* The route of a mixture of experts: the router's logits to probabilities by a softmax over every expert (float32),
   the top_k most probable chosen one at a time (the lowest index first on a tie: a later expert must be greater),
   divided by their sum (in the order chosen) with renormalize. The chosen, ranked by expert index, give the route
   registers their weights and a bank word of every bank their ids, where the bank readers take them. */
/* routine route */
inline void route(ONCHIP float *restrict outputs, __local float *restrict probs, ONCHIP float *restrict weights,
                  __global bank_word_t *restrict bank0, __global bank_word_t *restrict bank1,
                  __global bank_word_t *restrict bank2, __global bank_word_t *restrict bank3, const uint16 w) {
    uint experts = w.se, top_k = w.s5, src = (w.s2 & OFFSET_MASK) * OV, renormalize = w.s9;
    float most = -INFINITY;
    /* the logits copied on chip, a bank word a cycle, and their maximum */
    /* loop route.most */
    for (uint c = 0; c < experts; c += OV) {
        float word_most = -INFINITY;
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            float v = SELECT(c + e < experts, outputs[src + c + e], -INFINITY);
            probs[c + e] = v;
            word_most = fmax(word_most, v);
        }
        most = fmax(most, word_most);
    }
    float total = 0.0f;
    /* loop route.exp */
    for (uint c = 0; c < experts; c += OV) {
        float part = 0.0f;
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            float p = SELECT(c + e < experts, exp(probs[c + e] - most), 0.0f);
            probs[c + e] = p;
            part += p;
        }
        total += part;
    }
    uint ids[TOP_K_MAX];
    float chosen[TOP_K_MAX], sum = 0.0f;
    UNROLL(TOP_K_MAX)
    for (uint j = 0; j < TOP_K_MAX; j++) { ids[j] = 0u; chosen[j] = 0.0f; }
    /* each choice one scan, a bank word of probabilities a cycle: the greatest not yet chosen, the lowest index
       first on a tie (a later one must be greater, within the word and across words) */
    /* loop route.choose */
    for (uint j = 0; j < top_k; j++) {
        float best = -1.0f;
        uint at = 0;
        /* loop route.scan */
        for (uint c = 0; c < experts; c += OV) {
            float word_best = -1.0f;
            uint word_at = 0;
            UNROLL(OV)
            for (uint e = 0; e < OV; e++) {
                uint taken = 0;
                UNROLL(TOP_K_MAX)
                for (uint i = 0; i < TOP_K_MAX; i++) taken |= i < j && ids[i] == c + e;
                float p = probs[c + e] / total;
                if (c + e < experts && !taken && p > word_best) { word_best = p; word_at = c + e; }
            }
            if (word_best > best) { best = word_best; at = word_at; }
        }
        ids[j] = at;
        chosen[j] = best;
        sum += best;
    }
    uint rank[TOP_K_MAX];
    UNROLL(TOP_K_MAX)
    for (uint j = 0; j < TOP_K_MAX; j++) {
        uint r = 0;
        UNROLL(TOP_K_MAX)
        for (uint i = 0; i < TOP_K_MAX; i++) r += SELECT(i < top_k && ids[i] < ids[j], 1u, 0u);
        rank[j] = r;
        if (j < top_k) weights[r] = SELECT(renormalize != 0u, chosen[j] / sum, chosen[j]);
    }
    /* loop route.ids */
    for (uint c = 0; c < WORDS(top_k, 4); c++) {
        bank_word_t word;
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            word.u[e] = 0u;
            UNROLL(TOP_K_MAX)
            for (uint j = 0; j < TOP_K_MAX; j++) {
                if (j < top_k && rank[j] == c * OV + e) word.u[e] = ids[j];
            }
        }
        bank0[w.s6 + c] = word;
        bank1[w.s6 + c] = word;
        bank2[w.s6 + c] = word;
        bank3[w.s6 + c] = word;
    }
#if defined(INTELFPGA_CL)
    mem_fence(CLK_GLOBAL_MEM_FENCE | CLK_CHANNEL_MEM_FENCE);
    UNROLL(BANKS)
    for (uint b = 0; b < BANKS; b++) write_channel_intel(routed[b], 1u);
#endif
}

/* routine expert_sum */
inline void expert_sum(ONCHIP float *restrict attended, ONCHIP float *restrict outputs, ONCHIP float *restrict weights,
                       const uint16 w) {
    uint n = w.s4, dst = (w.s1 & OFFSET_MASK) * OV, src = (w.s2 & OFFSET_MASK) * OV, slot = w.s9;
    float weight = weights[slot & (TOP_K_MAX - 1u)];
    uint first = slot == 0u;
    IVDEP /* dst and src are different buffers */
    /* loop expert_sum.words */
    for (uint c = 0; c < n; c += OV) {
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            if (c + e < n) {
                float held = SELECT(first, 0.0f, attended[dst + c + e]);
                attended[dst + c + e] = held + weight * outputs[src + c + e];
            }
        }
    }
}
""",
}


def _projection_norms(present: bool) -> dict[str, str]:
    """`projection_norms`: a rope whose source is in `inputs` (w.s2's array id), where an RMS norm of the whole
    query or key (OLMoE's, an RMS norm of a matvec's output: the `sandwich` part) wrote it; the two halves' loads
    read the array the word names."""
    first = "outputs[(first_word + (e < first_shift)) * OV + e]"
    second = "outputs[(second_word + (e < second_shift)) * OV + e]"
    if not present:
        return {"rope_inputs_let": "", "rope_first_load": first, "rope_second_load": second}
    return {
        "rope_inputs_let": "\n    uint normed = (w.s2 >> ARRAY_SHIFT) == ARRAY_INPUTS;",
        "rope_first_load": f"SELECT(normed, {first.replace('outputs', 'inputs')}, {first})",
        "rope_second_load": f"SELECT(normed, {second.replace('outputs', 'inputs')}, {second})",
    }


@cache
def _body(features: frozenset[str]) -> str:
    """The engine's text after its `#define`s, with the optional parts `features` (the others print nothing)."""
    optional = {key: text if "bias" in features else "" for key, text in _BIAS.items()}
    optional |= _WINDOW if "window" in features else _UNWINDOWED
    optional |= {key: text if "head_norm" in features else "" for key, text in _HEAD_NORM.items()}
    optional |= _PARTIAL if "partial_rotary" in features else _WHOLE
    optional |= _gemma(features)
    optional |= _STORED if "stored" in features else _FLOATS
    optional |= {key: text if "experts" in features else "" for key, text in _EXPERTS.items()}
    optional |= _projection_norms("projection_norms" in features)
    if "projection_norms" in features:  # the rope reaches `inputs` too
        optional["rope_norm_param"] += " ONCHIP float *restrict inputs,"
        optional["rope_norm_arg"] += ", inputs"
    if "experts" in features:  # an expert's rows: its stack's, from the chosen expert's first row
        optional["read_matvec_base"] += " + expert * w.sc"
        optional["add_param"] += " ONCHIP float *restrict attended,"  # the experts' sum is in `attended`
        optional["add_arg"] += "attended, "
        optional["add_let"] = "\n    uint from = w.s3 >> ARRAY_SHIFT;"
        optional["add_rhs"] = f"SELECT(from == ARRAY_ATTENDED, attended[rhs + c + e], {optional['add_rhs']})"
    optional["embed_lanes"] = optional["embed_lanes"].replace("${embed_scale}", optional["embed_scale"])
    optional["matvec_params"] = optional["matvec_bias_param"] + optional["matvec_prior_param"]
    if "plus_one" in features and "head_norm" in features:  # the head norm's weights taken as one plus each
        load = "head_weights[c * VECTOR_WIDTH + e] = WEIGHT_AT(word, e);"
        optional["rope_norm_load"] = optional["rope_norm_load"].replace(
            load, load[:-1] + " + SELECT(w.sc != 0u, 1.0f, 0.0f);"
        )
    return Template(_TEMPLATE).substitute(optional, **_FIXED)


# Weights as stored (`stored`: docs/d5005.md, "Weights as stored"): an embedding row's or a matvec's word holds its
# weight's format in w.s3 (0: the image's floats, FORMAT_*: a block format). A stored row is groups of
# BURST_BYTES / 2 blocks, each its scale words (SCALE_WORDS: the blocks' f16 scales, then Q4_1's minimums) then its
# code words (the blocks' codes as stored); both readers stream ROW_WORDS a row. The compute routines place each
# word in its group from c alone (constant divisors, one for each format: `STORED_PLACE`), keep a group's scale
# words in registers as they pass, and dequantize each code word's numbers (`stored_at`: codes times the block's
# scale, plus its minimum for Q4_1, in float32, as gguf-py does) before the float32 multiply-accumulate: a matvec
# takes a whole code word a cycle (BURST_BYTES or 2 * BURST_BYTES numbers, STORED_LANES lanes), an embedding row
# stores it OV numbers at a time.
_STORED_HELPERS = r"""
/* ---- weights as stored: groups of blocks, their scales in registers, dequantized in the datapath ---- */
#define STORED_LANES (2 * BURST_BYTES)      /* numbers of a 4-bit code word: a matvec's lanes for stored rows */
#define GROUP_NUMBERS (16 * BURST_BYTES)    /* numbers of a group: BURST_BYTES / 2 blocks of 32 */
#define SCALE_WORDS(f) SELECT((f) == FORMAT_Q4_1, 2u, 1u)
#define CODE_BITS(f) SELECT((f) == FORMAT_Q8_0, 8u, 4u)
#define PER_WORD(f) (BURST_BYTES * 8 / CODE_BITS(f))  /* numbers of one code word */
#define GROUP_WORDS_4(f) SELECT((f) == FORMAT_Q4_1, GROUP_WORDS_Q4_1, GROUP_WORDS_Q4_0)
#define GROUP_WORDS(f) SELECT((f) == FORMAT_Q8_0, GROUP_WORDS_Q8_0, GROUP_WORDS_4(f))
/* bank words of a row of `cols` numbers (whole blocks): whole groups, then a last part-group's scale words and the
   code words its blocks fill */
inline uint stored_words(uint cols, uint f) {
    uint blocks = cols / 32, full = blocks / (BURST_BYTES / 2), rest = blocks % (BURST_BYTES / 2);
    uint tail = SELECT(rest != 0u, SCALE_WORDS(f) + (rest * 4 * CODE_BITS(f) + BURST_BYTES - 1) / BURST_BYTES, 0u);
    return full * GROUP_WORDS(f) + tail;
}
#define ROW_WORDS(cols, f) SELECT((f) != 0u, stored_words((cols), (f)), WORDS((cols), WEIGHT_BYTES))
/* word c of a row: its group (a constant divisor for each format), its place in the group */
#define GROUP_OF_4(c, f) SELECT((f) == FORMAT_Q4_1, (c) / GROUP_WORDS_Q4_1, (c) / GROUP_WORDS_Q4_0)
#define GROUP_OF(c, f) SELECT((f) == FORMAT_Q8_0, (c) / GROUP_WORDS_Q8_0, GROUP_OF_4(c, f))

/* an IEEE half's bits as a float32 (exact: subnormals, infinities and NaNs included) */
inline float half_float(uint h) {
    uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float tiny = as_float(sign | 0x3f800000u) * ((float)m * 5.9604644775390625e-8f);
    uint bits = SELECT(e == 31u, 0x7f800000u | (m << 13), ((e + 112u) << 23) | (m << 13));
    return SELECT(e == 0u, tiny, as_float(sign | bits));
}

/* number e of code word k of a group, dequantized as gguf-py does (float32): Q8_0 d * q; Q4_0 d * (q - 8); Q4_1
   d * q + m, d and m its block's f16 scale and minimum (a group's block j: half j of the scale words). A Q8_0 word
   holds two blocks' 32 bytes of codes; a 4-bit word four blocks' 16 bytes, the low nibbles a block's first 16
   numbers, the high ones its next 16 (the file's order). */
inline float stored_at(bank_word_t codes, bank_word_t scales, bank_word_t mins, uint f, uint k, uint e) {
    uint wide = f == FORMAT_Q8_0;
    uint lane = e & (PER_WORD(f) - 1u);
    uint at = SELECT(wide, lane, (lane / 32u) * 16u + lane % 16u);
    uint byte = (codes.u[at >> 2] >> (8u * (at & 3u))) & 0xffu;
    uint nibble = (byte >> SELECT(lane % 32u >= 16u, 4u, 0u)) & 0xfu;
    uint block = ((k * PER_WORD(f) + lane) / 32u) & (BURST_BYTES / 2 - 1);
    uint shift = 16u * (block & 1u);
    float d = half_float((scales.u[block >> 1] >> shift) & 0xffffu);
    float m = half_float((mins.u[block >> 1] >> shift) & 0xffffu);
    int q = SELECT(wide, ((int)byte ^ 0x80) - 0x80, (int)nibble - SELECT(f == FORMAT_Q4_0, 8, 0));
    float p = d * (float)q;
    return SELECT(f == FORMAT_Q4_1, p + m, p);
}
"""
_STORED = {
    "stored_helpers": _STORED_HELPERS,
    "row_words": "ROW_WORDS(cols, w.s3)",
    "embed_stored_let": "\n    uint fmt = w.s3;\n    bank_word_t scales, mins;",
    "embed_lanes": """
        uint group = GROUP_OF(c, fmt), place = c - group * GROUP_WORDS(fmt), coded = place >= SCALE_WORDS(fmt);
        uint code_word = SELECT(coded, place - SCALE_WORDS(fmt), 0u);
        uint slice = group * (GROUP_NUMBERS / BURST_BYTES) + code_word * SELECT(fmt == FORMAT_Q8_0, 1u, 2u);
        if (place == 0u) scales = word;
        if (place == 1u) mins = word;
        /* a stored code word's numbers VECTOR_WIDTH at a time (a float word's in the first): one store a lane */
        for (uint p = 0; p < STORED_LANES / VECTOR_WIDTH; p++) {
            UNROLL(VECTOR_WIDTH)
            for (uint e = 0; e < VECTOR_WIDTH; e++) {
                uint lane = p * VECTOR_WIDTH + e;
                uint piece = SELECT(fmt != 0u, slice * (BURST_BYTES / VECTOR_WIDTH) + p, c);
                uint k = piece * VECTOR_WIDTH + e;
                uint valid = SELECT(fmt != 0u, coded && lane < PER_WORD(fmt), p == 0u);
                float v = SELECT(fmt != 0u, stored_at(word, scales, mins, fmt, code_word, lane), WEIGHT_AT(word, e));
                if (valid && k < cols) residual[dst + k] = v${embed_scale};
            }
        }""",
    "matvec_stored_let": "\n    uint fmt = w.s3, span = SELECT(fmt != 0u, cols, words * VECTOR_WIDTH);",
    "matvec_span": "span",
    "matvec_scales": "\n    bank_word_t scales[BANKS], mins[BANKS];",
    "matvec_place": """
            uint group = GROUP_OF(c, fmt), place = c - group * GROUP_WORDS(fmt), coded = place >= SCALE_WORDS(fmt);
            uint code_word = SELECT(coded, place - SCALE_WORDS(fmt), 0u);
            uint slice = group * (GROUP_NUMBERS / BURST_BYTES) + code_word * SELECT(fmt == FORMAT_Q8_0, 1u, 2u);""",
    "matvec_stored": """
                    if (fmt != 0u) {
                        if (place == 0u) scales[b] = word;
                        if (place == 1u) mins[b] = word;
                        UNROLL(STORED_LANES)
                        for (uint e = 0; e < STORED_LANES; e++) {
                            float x = vector[slice * BURST_BYTES + e];
                            uint valid = coded && e < PER_WORD(fmt) && slice * BURST_BYTES + e < cols;
                            sum += SELECT(valid, stored_at(word, scales[b], mins[b], fmt, code_word, e) * x, 0.0f);
                        }
                    } else {""",
    "matvec_stored_end": "                    }\n",
    "vector_pad": " + STORED_LANES",
}
_FLOATS = {
    "stored_helpers": "",
    "row_words": "WORDS(cols, WEIGHT_BYTES)",
    "embed_stored_let": "",
    "embed_lanes": """
        UNROLL(VECTOR_WIDTH)
        for (uint e = 0; e < VECTOR_WIDTH; e++) {  /* one store a lane: the word is taken from its bank first */
            uint k = c * VECTOR_WIDTH + e;
            if (k < cols) residual[dst + k] = WEIGHT_AT(word, e)${embed_scale};
        }""",
    "matvec_stored_let": "",
    "matvec_span": "words * VECTOR_WIDTH",
    "matvec_scales": "",
    "matvec_place": "",
    "matvec_stored": "",
    "matvec_stored_end": "",
    "vector_pad": "",
}


def _columns(parts: bool) -> dict[str, str]:
    """`columns`: a matvec over a part of its columns (w.sb the first, a multiple of the VECTOR_WORDS copy, so of a
    bank word's weights and of OV; w.s5 the part's count), for an input longer than the copy: its bank readers
    start each row's words at the first column's burst and the copy at the first column's bank word; a part after
    the first (w.sb != 0) first copies what dst holds into `prior` (`matvec.prior`, a bank word a cycle) and adds
    it to each total as it stores it, so the rows loop stores `outputs` without loading it."""
    if not parts:
        return {
            "read_matvec_first": "",
            "read_matvec_base": "w.s6",
            "matvec_src": "(w.s2 & OFFSET_MASK) * OV",
            "matvec_prior_load": "",
            "matvec_prior_param": "",
            "matvec_prior_arg": "",
            "prior_array": "",
            "matvec_accumulate": "",
        }
    return {
        "read_matvec_first": "\n    uint base = w.s6 + w.sb * WEIGHT_BYTES / BURST_BYTES;",
        "read_matvec_base": "base",
        "matvec_src": "((w.s2 & OFFSET_MASK) + w.sb / OV) * OV",
        "matvec_prior_load": """
    uint adding = w.sb != 0u, prior_count = SELECT(adding, rows, 0u);
    IVDEP
    /* loop matvec.prior */
    for (uint c = 0; c < prior_count; c += OV) {
        UNROLL(OV)
        for (uint e = 0; e < OV; e++) {
            if (c + e < prior_count) prior[c + e] = outputs[dst + c + e];
        }
    }""",
        "matvec_prior_param": " __local float *restrict prior,",
        "matvec_prior_arg": ", prior",
        "prior_array": "\n    __local float prior[PRIOR_WORDS] BANKED(OV);",
        "matvec_accumulate": " + SELECT(adding, prior[k], 0.0f)",
    }


def _gemma(features: frozenset[str]) -> dict[str, str]:
    """Gemma's parts: `embed_scale`, the embedding row times the word's float (0: none); `plus_one`, an RMS norm
    (or a rope's head norm) by one plus its weight where the word's ctx is 1; `gelu_tanh`, the gated product's
    gate GELU with the tanh approximation (PyTorch's) where the word's heads is 1; `sandwich`, an RMS norm that
    reads a matvec's output in `outputs` and an add that reads its rhs in `inputs` (the sandwich norms: a matvec's
    output normed into what the residual add reads), each from the array its buffer field names; `logit_softcap`,
    the arg-max's words soft-capped (tanh(x / cap) * cap) where the word's float is a cap; `softcap`, the
    attention's scores soft-capped where its word holds a cap. Each changes a routine's expressions, not its
    loops."""
    scaled, plus, gelu, sandwich, capped = (
        f in features for f in ("embed_scale", "plus_one", "gelu_tanh", "sandwich", "logit_softcap")
    )
    silu = "(g * (tanh(g * 0.5f) * 0.5f + 0.5f))"
    geglu = "((0.5f * g) * (1.0f + tanh(0.7978845608028654f * (g + 0.044715f * g * g * g))))"
    weight = "(WEIGHT_AT(word, e) + plus)" if plus else "WEIGHT_AT(word, e)"
    source = "SELECT(from == ARRAY_OUTPUTS, outputs[src + k], residual[src + k])" if sandwich else "residual[src + k]"
    store = f"            if (k < n) inputs[dst + k] = ({source} * scale) * {weight};"
    lets = ("\n    uint from = w.s2 >> ARRAY_SHIFT;" if sandwich else "") + (
        "\n    float plus = SELECT(w.sc != 0u, 1.0f, 0.0f);" if plus else ""
    )
    return {
        "embed_scale_let": "\n    float factor = SELECT(w.sd != 0u, as_float(w.sd), 1.0f);" if scaled else "",
        "embed_scale": " * factor" if scaled else "",
        "rms_norm_param": " ONCHIP float *restrict outputs," if sandwich else "",
        "rms_norm_arg": ", outputs" if sandwich else "",
        "rms_norm_let": lets,
        "rms_norm_square_src": (
            "SELECT(from == ARRAY_OUTPUTS, outputs[src + c + e], residual[src + c + e])"
            if sandwich
            else "residual[src + c + e]"
        ),
        "rms_norm_store": store,
        "add_param": " ONCHIP float *restrict inputs," if sandwich else "",
        "add_arg": "inputs, " if sandwich else "",
        "add_let": "\n    uint from = w.s3 >> ARRAY_SHIFT;" if sandwich else "",
        "add_rhs": (
            "SELECT(from == ARRAY_INPUTS, inputs[rhs + c + e], outputs[rhs + c + e])"
            if sandwich
            else "outputs[rhs + c + e]"
        ),
        "gelu_let": "\n    uint gelu = w.s9;" if gelu else "",
        "gated": f"SELECT(gelu, {geglu}, {silu})" if gelu else silu,
        "count_mask": " & 0xffffu" if "softcap" in features else "",
        **_columns("columns" in features),
        "softcap_let": (
            "\n    uint cap_bits = (w.s9 & 0xffff0000u) | (w.sa >> 16), capped = cap_bits != 0u;"
            "\n    float cap = as_float(cap_bits);"
            if "softcap" in features
            else ""
        ),
        "score_row": (
            "SELECT(capped, tanh(dot * scale / cap) * cap, dot * scale)" if "softcap" in features else "dot * scale"
        ),
        "score_own": (
            "SELECT(capped, tanh(mine * scale / cap) * cap, mine * scale)" if "softcap" in features else "mine * scale"
        ),
        "argmax_cap_let": "\n    uint capped = w.sd != 0u;\n    float cap = as_float(w.sd);" if capped else "",
        "argmax_cap": "\n                v = SELECT(capped, tanh(v / cap) * cap, v);" if capped else "",
    }


# The shift-register sums of the matvec's rows, the norm's squares and the softmax's exponentials (and the
# attention's dot product with the position's own key) are printed by the three functions above.
_FIXED = dict(
    matvec_clear=_shift_clear("shift[b]", 12),
    matvec_add=_shift_add("shift[b]", "sum", 16),
    matvec_total=_shift_total("total", "shift[b]", 12),
    rms_norm_clear=_shift_clear("shift", 4),
    rms_norm_add=_shift_add("shift", "sum", 8),
    rms_norm_total=_shift_total("squares", "shift", 4),
    current_clear=_shift_clear("here[g]", 12),
    current_add=_shift_add("here[g]", "sum", 16),
    current_total=_shift_total("mine", "here[g]", 12),
    cache_run=_run_in(
        "from == ARRAY_ROTATED ? rotated[ADDRESS] : outputs[ADDRESS]",
        "src + h * head_dim + c * CPW", "c * CPW", "elem < head_dim", "v", 12,
    ),
    key_run=_run_in(
        "rotated[ADDRESS]", "key + h * head_dim + i * CPW", "i * CPW", "elem < head_dim", "k_here", 12, "cached"
    ),
    query_run=_run_in(
        "rotated[ADDRESS]", "query + (h * group + g) * head_dim + i * CPW", "i * CPW",
        "elem < head_dim && g < group", "q_here", 16,
    ),
    value_run=_run_in(
        "outputs[ADDRESS]", "value + h * head_dim + piece * CPW", "piece * CPW", "elem < head_dim", "v_here", 12,
        "cached",
    ),
    output_run=_run_out(
        "attended", "dst + (h * group + member) * head_dim + piece * CPW", "piece * CPW", "elem < head_dim",
        "merged", 12,
    ),
)  # fmt: skip


@dataclass(frozen=True)
class OpenclTarget(Target):
    """`-t d5005-opencl`: the engine's OpenCL C for the `d5005.program` in the module."""

    name: ClassVar[str] = "d5005-opencl"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        program = the_d5005_program(module, self.name)
        output.write(engine_source(program.identity.data, program.params, engine_features(program)))


def the_d5005_program(module: ModuleOp, target: str) -> d5005.ProgramOp:
    found = [op for op in module.ops if isinstance(op, d5005.ProgramOp)]
    if len(found) != 1:
        raise DiagnosticException(f"{target} target: expects one d5005.program in the module, found {len(found)}")
    return found[0]
