// kern_attn_decode_rows at 8 warps a block and 3 page slots per warp (head_dim 128, up to 8
// query heads per kv head): a variant of the product's 4 x 3, timed by tools/lab/time_attention.py.
#define KERN_ROWS_WARPS 8
#define KERN_ROWS_STAGES 3
#include "attention_rows_variant.cuh"

KERN_ROWS_VARIANT(kern_attn_decode_rows_w8s3)
