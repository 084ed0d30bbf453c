// kern_attn_decode_rows over a head-major page ([k|v][nkv][page_tokens][head_dim]: a kv head's 16
// k rows, then its 16 v rows, each one contiguous 4 KiB run at head_dim 128) instead of the
// product's token-major page ([k|v][page_tokens][nkv][head_dim]: a head's rows 256 B pieces at a
// 2 KiB stride): a variant timed by tools/lab/time_attention.py, to see what the access pattern
// costs the KV stream. Its outputs differ from the product entry's on the same bytes (another
// layout), so the script does not compare them.
#define KERN_ROWS_HEAD_MAJOR
#include "attention_rows_variant.cuh"

KERN_ROWS_VARIANT(kern_attn_decode_rows_hm)
