"""FlashInfer's MLA decode as a peer for bench_decode.py (not part of the library).

FlashInfer (>= 0.5, JIT wheels of ~7 MB; the kernels compile with nvcc on first use) takes MLA as
separate NoPE / RoPE tensors: q_nope [tokens, h_q, 512], q_pe [tokens, h_q, 64], ckv_cache
[pages, 64, 512], kpe_cache [pages, 64, 64], a CSR page list per request and the lengths.
`FlashInferMLA(q, k_cache, block_table, cache_seqlens, causal)` builds those from
flash_mla_with_kvcache's inputs once (copies; NaN-poisoned slots past each length are zeroed, as
for the SDPA baseline) and plans; `run()` is the timed call and returns out [b, s_q, h_q, 512].
"""
from __future__ import annotations

import torch


class FlashInferMLA:
    def __init__(self, q, k_cache, block_table, cache_seqlens, causal: bool):
        import flashinfer

        b, s_q, h_q, d = q.shape
        dev = q.device
        self.shape = (b, s_q, h_q, 512)
        q2 = q.reshape(b * s_q, h_q, d)
        self.q_nope, self.q_pe = q2[..., :512].contiguous(), q2[..., 512:].contiguous()
        kc = torch.nan_to_num(k_cache[:, :, 0])
        self.ckv, self.kpe = kc[..., :512].contiguous(), kc[..., 512:].contiguous()
        lens = cache_seqlens.to(torch.int32)
        pages = (lens + 63) // 64
        kv_indptr = torch.zeros(b + 1, dtype=torch.int32, device=dev)
        kv_indptr[1:] = torch.cumsum(pages, 0)
        cols = torch.arange(block_table.shape[1], device=dev).view(1, -1)
        kv_indices = block_table[cols < pages.view(-1, 1)].to(torch.int32).contiguous()
        qo_indptr = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32, device=dev)
        self.out = torch.empty(b * s_q, h_q, 512, dtype=q.dtype, device=dev)
        ws = torch.empty(128 * 1024 * 1024, dtype=torch.int8, device=dev)
        self.wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
        self.wrapper.plan(qo_indptr, kv_indptr, kv_indices, lens, h_q, 512, 64, 64, causal,
                          576 ** -0.5, q.dtype, k_cache.dtype)

    def run(self):
        self.wrapper.run(self.q_nope, self.q_pe, self.ckv, self.kpe, out=self.out)
        return self.out.view(self.shape)


def main():
    """Compile FlashInfer's MLA kernels (JIT, first use) and check them against the float32 reference
    on a few shapes: uniform and ragged lengths, h_q 16 and 128, s_q 1 and 2 (causal)."""
    import time

    import flashmla
    from flashmla.testing import make_inputs

    t0 = time.perf_counter()
    for h_q, s_q in [(16, 1), (128, 1), (16, 2), (128, 2)]:
        for lens in ([4096] * 4, [100, 1, 64, 65, 4097, 2000]):
            q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device="cuda", seed=h_q + s_q)
            fi = FlashInferMLA(q, kc, bt, sl, causal=s_q > 1)
            out = fi.run().float()
            ref, _ = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=s_q > 1)
            cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item()
            err = (out - ref).abs().max().item()
            print(f"h_q {h_q:3d} s_q {s_q} lens {lens[:3]}...: cosine {cos:.7f}, max |err| {err:.2e}, "
                  f"{time.perf_counter() - t0:.1f} s so far", flush=True)


if __name__ == "__main__":
    main()
