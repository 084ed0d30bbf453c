// The cluster-free rows entry (attention_rows_variant.cuh's KERN_ROWS_FLAT) at 8 pages a split at
// least: a variant timed by tools/lab/time_attention.py.
#define KERN_ROWS_TARGET 0
#include "attention_rows_variant.cuh"

KERN_ROWS_FLAT(kern_attn_decode_rows_flat8, 8)
