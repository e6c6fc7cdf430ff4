"""Small helpers shared by the book's pages. Each is introduced and explained
on one page (shown there from this source) and imported by the later ones."""
from bookutils.attention import attention_2d, attention_weights_2d, softmax_row, softmax_rows
from bookutils.dense import dense_attention
from bookutils.masks import causal_keep, masked_attention_2d
from bookutils.measure import best_times, loglog_slope
from bookutils.online import (absorb_block, merge_stats, streaming_softmax, streaming_stats,
                              streaming_trace, streaming_weighted_sum)
from bookutils.plotting import weights_heatmap
from bookutils.positions import sinusoidal_table
from bookutils.tiling import blockwise_attention

__all__ = ["attention_2d", "attention_weights_2d", "softmax_row", "softmax_rows", "weights_heatmap",
           "causal_keep", "masked_attention_2d", "sinusoidal_table",
           "dense_attention", "best_times", "loglog_slope",
           "absorb_block", "streaming_stats", "streaming_softmax", "streaming_weighted_sum",
           "merge_stats", "streaming_trace", "blockwise_attention"]
