// kern_attn_decode_rows with the cluster path up to 16 pages a split (8 x 16 pages, 2,048 tokens;
// the product's: 8 pages, 1,024 tokens) and the product's per-row plan otherwise, 4 warps of 3 page
// slots: a variant timed by tools/lab/time_attention.py.
#define KERN_ROWS_CLUSTER_PAGES 16
#include "attention_rows_variant.cuh"

KERN_ROWS_VARIANT(kern_attn_decode_rows_c16)
