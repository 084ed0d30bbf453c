// kern_attn_decode_rows at a launch target of 4096 blocks with work (the product's: 512; 0: no
// launch share, each row's plan from its length alone), 4 warps of 3 page slots: a variant timed
// by tools/lab/time_attention.py.
#define KERN_ROWS_TARGET 4096
#include "attention_rows_variant.cuh"

KERN_ROWS_VARIANT(kern_attn_decode_rows_t4096)
