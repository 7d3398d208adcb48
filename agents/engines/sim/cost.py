"""How long a simulated engine takes: prefill per uncached token, a decode step per batch.

Calibrated to SGLang serving Llama-3.1-8B-Instruct (bf16) on one H100 SXM 80 GB:

- **Prefill.** sgl-project/sglang PR #1060 (comment of 2024-08-13) reports
  `sglang.bench_serving --dataset-name random --random-input 8192 --random-output 8
  --num-prompts 1000` against `launch_server --model-path meta-llama/Meta-Llama-3.1-8B-Instruct
  --disable-radix-cache` on an H100: input token throughput 27,670 tok/s with no cache
  hits, so an uncached prompt token costs 1 / 27,670 s = 36.1 us.
- **Decode.** A decode step of an 8B bf16 model reads its 16.06 GB of weights once per
  step; at the H100 SXM's 3.35 TB/s that is 4.8 ms, and SGLang's published batch-1
  inter-token latencies for this model on an H100 sit near 6-7 ms, so the base step is
  6.0 ms. Each running request adds its KV cache to the read: 32 layers x 8 KV heads x
  128 dims x 2 (K and V) x 2 bytes = 128 KiB a token, 39 ns a token at 3.35 TB/s; and a
  small per-sequence cost of sampling and scheduling (40 us).
- **Capacity.** 80 GB x 0.88 (SGLang's default static memory fraction for this size),
  less 16.06 GB of weights, over 128 KiB a token: about 410,000 KV tokens.
- **PD transfer.** A KV cache moves at an RDMA-class 25 GB/s: 5.2 us a token, plus 1 ms
  of bootstrap handshake.

`bench/README.md` records how the simulator compares with these figures when measured.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2


@dataclass(frozen=True)
class CostModel:
    prefill_s_per_token: float = 1 / 27_670
    prefill_overhead_s: float = 0.002
    decode_base_s: float = 0.006
    decode_s_per_seq: float = 40e-6
    decode_s_per_context_token: float = KV_BYTES_PER_TOKEN / 3.35e12
    kv_transfer_s_per_token: float = KV_BYTES_PER_TOKEN / 25e9
    kv_transfer_overhead_s: float = 0.001
    max_total_tokens: int = 410_000

    def prefill(self, uncached_tokens: int) -> float:
        return self.prefill_overhead_s + uncached_tokens * self.prefill_s_per_token

    def decode_step(self, batch: int, context_tokens: int) -> float:
        return (
            self.decode_base_s
            + batch * self.decode_s_per_seq
            + context_tokens * self.decode_s_per_context_token
        )

    def kv_transfer(self, tokens: int) -> float:
        return self.kv_transfer_overhead_s + tokens * self.kv_transfer_s_per_token
