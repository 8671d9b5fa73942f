"""Speculative decoding (week 18).

- `lib.spec_decode.speculative`  `verify`, `speculative_generate` with KV-cache rollback, acceptance theory
- `lib.spec_decode.drafts`       the drafts: prompt lookup, early exit, int8 (`Int8Linear`), FR-Spec, distilled
- `lib.spec_decode.draft_head`   a draft head that reads the target's hidden state (EAGLE-style)
- `lib.spec_decode.speculative_batch`  the ragged batch: each row accepts a different number of tokens per round
"""
