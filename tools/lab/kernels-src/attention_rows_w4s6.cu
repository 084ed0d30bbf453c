// kern_attn_decode_rows at 4 warps a block and 6 page slots per warp (head_dim 128, up to 8
// query heads per kv head): a variant of the product's 4 x 3, timed by tools/lab/time_attention.py.
#define KERN_ROWS_WARPS 4
#define KERN_ROWS_STAGES 6
#include "attention_rows_variant.cuh"

KERN_ROWS_VARIANT(kern_attn_decode_rows_w4s6)
