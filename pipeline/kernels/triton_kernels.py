"""The Triton kernels of the fused tiles (device code), launched by ``triton_tiles``, all three with
the arguments of ``triton_tiles._launch_args`` after their pointers.

Forward, one program per (query block, batch x head) over key blocks: u_i = sum_j sim_ij v_j and
S_i = sum_j sim_ij on admitted keys, sim_ij = f(c q_i k_j^T + b_ij), c the score factor. Backward recomputes each
tile, one kernel over key blocks for dk and dv, one over query blocks for dq (no atomics):
dsim_ij = du_i . v_j + dS_i,  ds_ij = dsim_ij f'(s_ij),  dq = c ds k,  dk = c ds^T q,  dv = sim^T du.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

SIMILARITIES = {"sigmoid": 0, "elu1": 1, "identity": 2}
MASKS = {"causal": 0, "prefix": 1, "sliding": 2}


if triton is not None:

    @triton.jit
    def _admitted(q_pos, k_pos, Tq_end, Tk, window, prefix, MASK: tl.constexpr):
        """The model's mask (masks.admitted_pairs) for query positions x key positions, inside bounds."""
        qi, kj = q_pos[:, None], k_pos[None, :]
        ok = kj <= qi
        if MASK == 1:
            ok = ok | ((qi < prefix) & (kj < prefix))
        if MASK == 2:
            ok = ok & (qi - kj < window)
        return ok & (qi < Tq_end) & (kj < Tk)

    @triton.jit
    def _block_key_range(pid_m, BLOCK_M: tl.constexpr, Tq, Tk, q_offset, window, prefix, MASK: tl.constexpr):
        """Key positions [lo, hi) that some query of query block ``pid_m`` sees (MaskSpec.key_range)."""
        q_lo, q_hi = pid_m * BLOCK_M + q_offset, tl.minimum(pid_m * BLOCK_M + BLOCK_M, Tq) + q_offset
        hi = tl.maximum(q_hi, prefix) if MASK == 1 else q_hi
        lo = tl.maximum(q_lo - window + 1, 0) if MASK == 2 else q_lo * 0
        return lo, tl.minimum(hi, Tk)

    @triton.jit
    def _block_query_range(pid_n, BLOCK_N: tl.constexpr, Tk, q_offset, window, prefix, MASK: tl.constexpr):
        """Query positions [lo, hi) that see some key of key block ``pid_n`` (MaskSpec.query_range)."""
        k_lo = pid_n * BLOCK_N
        lo = tl.maximum(k_lo, q_offset)
        lo = tl.where(k_lo < prefix, q_offset, lo) if MASK == 1 else lo
        hi = tl.minimum(Tk, tl.minimum(k_lo + BLOCK_N, Tk) + window - 1) if MASK == 2 else Tk
        return lo, hi

    @triton.jit
    def _tile_sim(
        q,
        k,
        BIAS,
        bias_off,
        offs_m,
        offs_n,
        ok,
        score_factor: tl.constexpr,
        sbq,
        SIM: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """A tile's sim = f(s), zero off the mask, and f'(s), in fp32."""
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * score_factor
        if HAS_BIAS:
            s += tl.load(BIAS + bias_off + offs_m[:, None] * sbq + offs_n[None, :], mask=ok, other=0.0).to(s.dtype)
        if SIM == 0:
            sim = tl.sigmoid(s)
            grad = sim * (1.0 - sim)
        elif SIM == 1:
            sim = tl.where(s > 0, s + 1.0, tl.exp(tl.minimum(s, 0.0)))
            grad = tl.where(s > 0, 1.0, sim)
        else:
            sim = s
            grad = s * 0.0 + 1.0
        return tl.where(ok, sim, 0.0), grad

    @triton.jit
    def _program(H, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
        """This program's block index, batch x head (and b, h), the block's rows and the head-dim offsets."""
        pid, bh = tl.program_id(0), tl.program_id(1)
        return pid, bh, bh // H, bh % H, pid * BLOCK + tl.arange(0, BLOCK), tl.arange(0, BLOCK_D)

    @triton.jit
    def _load_rows(P, base, offs, stride, n, offs_d, D):
        """Rows ``offs`` (< n) of a [n, D] matrix at P + base with row stride ``stride``; zeros outside."""
        return tl.load(
            P + base + offs[:, None] * stride + offs_d[None, :],
            mask=(offs[:, None] < n) & (offs_d[None, :] < D),
            other=0.0,
        )

    @triton.jit
    def _store_rows(P, rows, offs, n, offs_d, D, x):
        """x into ``rows`` of a contiguous [*, D] matrix at P, where ``offs`` (their block's rows) < n."""
        tl.store(P + rows[:, None] * D + offs_d[None, :], x, mask=(offs[:, None] < n) & (offs_d[None, :] < D))

    # The kernels' shared arguments after the pointers: H, Tq, Tk, q_offset, window, prefix,
    # the (batch, head, row) strides of q, k, v, the (head, row) strides of the bias, then meta.
    @triton.jit
    def forward(
        Q,
        K,
        V,
        BIAS,
        U,
        S,
        H,
        Tq,
        Tk,
        q_offset,
        window,
        prefix,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        svb,
        svh,
        svt,
        sbh,
        sbq,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SIM: tl.constexpr,
        MASK: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
        ACC: tl.constexpr,
        SCORE_FACTOR: tl.constexpr,
    ):
        """u [B*H*Tq, D] and S [B*H*Tq] of one query block."""
        pid_m, bh, b, h, offs_m, offs_d = _program(H, BLOCK_M, BLOCK_D)
        q = _load_rows(Q, b * sqb + h * sqh, offs_m, sqt, Tq, offs_d, D)
        lo, hi = _block_key_range(pid_m, BLOCK_M, Tq, Tk, q_offset, window, prefix, MASK)
        u = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)
        row_sum = tl.zeros([BLOCK_M], dtype=ACC)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            k = _load_rows(K, b * skb + h * skh, offs_n, skt, Tk, offs_d, D)
            v = _load_rows(V, b * svb + h * svh, offs_n, svt, Tk, offs_d, D)
            ok = _admitted(offs_m + q_offset, offs_n, Tq + q_offset, Tk, window, prefix, MASK)
            sim, _ = _tile_sim(q, k, BIAS, h * sbh, offs_m, offs_n, ok, SCORE_FACTOR, sbq, SIM, HAS_BIAS, PRECISION)
            u += tl.dot(sim.to(v.dtype), v, input_precision=PRECISION)
            row_sum += tl.sum(sim, 1)
        out = bh * Tq + offs_m
        _store_rows(U, out, offs_m, Tq, offs_d, D, u)
        tl.store(S + out, row_sum, mask=offs_m < Tq)

    @triton.jit
    def backward_kv(
        Q,
        K,
        V,
        BIAS,
        DU,
        DS,
        DK,
        DV,
        H,
        Tq,
        Tk,
        q_offset,
        window,
        prefix,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        svb,
        svh,
        svt,
        sbh,
        sbq,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SIM: tl.constexpr,
        MASK: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
        ACC: tl.constexpr,
        SCORE_FACTOR: tl.constexpr,
    ):
        """dk and dv of one key block."""
        pid_n, bh, b, h, offs_n, offs_d = _program(H, BLOCK_N, BLOCK_D)
        k = _load_rows(K, b * skb + h * skh, offs_n, skt, Tk, offs_d, D)
        v = _load_rows(V, b * svb + h * svh, offs_n, svt, Tk, offs_d, D)
        lo, hi = _block_query_range(pid_n, BLOCK_N, Tk, q_offset, window, prefix, MASK)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        for start in range(lo - q_offset, hi - q_offset, BLOCK_M):
            offs_m = start + tl.arange(0, BLOCK_M)
            q = _load_rows(Q, b * sqb + h * sqh, offs_m, sqt, Tq, offs_d, D)
            du = _load_rows(DU, bh * Tq * D, offs_m, D, Tq, offs_d, D).to(q.dtype)
            d_row = tl.load(DS + bh * Tq + offs_m, mask=offs_m < Tq, other=0.0)
            ok = _admitted(offs_m + q_offset, offs_n, Tq + q_offset, Tk, window, prefix, MASK)
            sim, grad = _tile_sim(q, k, BIAS, h * sbh, offs_m, offs_n, ok, SCORE_FACTOR, sbq, SIM, HAS_BIAS, PRECISION)
            dsim = tl.dot(du, tl.trans(v), input_precision=PRECISION) + d_row[:, None]
            ds = tl.where(ok, dsim * grad, 0.0)
            dv += tl.dot(tl.trans(sim.to(q.dtype)), du, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        _store_rows(DK, bh * Tk + offs_n, offs_n, Tk, offs_d, D, dk * SCORE_FACTOR)
        _store_rows(DV, bh * Tk + offs_n, offs_n, Tk, offs_d, D, dv)

    @triton.jit
    def backward_q(
        Q,
        K,
        V,
        BIAS,
        DU,
        DS,
        DQ,
        H,
        Tq,
        Tk,
        q_offset,
        window,
        prefix,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        svb,
        svh,
        svt,
        sbh,
        sbq,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SIM: tl.constexpr,
        MASK: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
        ACC: tl.constexpr,
        SCORE_FACTOR: tl.constexpr,
    ):
        """dq of one query block."""
        pid_m, bh, b, h, offs_m, offs_d = _program(H, BLOCK_M, BLOCK_D)
        q = _load_rows(Q, b * sqb + h * sqh, offs_m, sqt, Tq, offs_d, D)
        du = _load_rows(DU, bh * Tq * D, offs_m, D, Tq, offs_d, D).to(q.dtype)
        d_row = tl.load(DS + bh * Tq + offs_m, mask=offs_m < Tq, other=0.0)
        lo, hi = _block_key_range(pid_m, BLOCK_M, Tq, Tk, q_offset, window, prefix, MASK)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            k = _load_rows(K, b * skb + h * skh, offs_n, skt, Tk, offs_d, D)
            v = _load_rows(V, b * svb + h * svh, offs_n, svt, Tk, offs_d, D)
            ok = _admitted(offs_m + q_offset, offs_n, Tq + q_offset, Tk, window, prefix, MASK)
            _, grad = _tile_sim(q, k, BIAS, h * sbh, offs_m, offs_n, ok, SCORE_FACTOR, sbq, SIM, HAS_BIAS, PRECISION)
            dsim = tl.dot(du, tl.trans(v), input_precision=PRECISION) + d_row[:, None]
            ds = tl.where(ok, dsim * grad, 0.0)
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        _store_rows(DQ, bh * Tq + offs_m, offs_m, Tq, offs_d, D, dq * SCORE_FACTOR)
