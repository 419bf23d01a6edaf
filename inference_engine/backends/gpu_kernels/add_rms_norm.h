// A residual add and the RMSNorm after it as one GPU kernel (kernel_add_rms_norm.inc), written once for every
// dialect on top of the dialect's macros (GQ_SIMD_SUM, GQ_BARRIER, GQ_SHARED_DECL, GQ_SQRT). Why: a layer adds the
// attention's output to the residual stream and norms the sum for the feed-forward (ffn_inp, ffn_norm), then adds
// the feed-forward's and the next layer norms that (attn_norm): each two kernels on MLX's GPU backends (MLX's
// compile does not fuse an element-wise op into mx.fast.rms_norm); this is one.
#ifndef GQ_ADD_RMS_NORM_H
#define GQ_ADD_RMS_NORM_H

#define GQ_NORM_THREADS 256  // threads a threadgroup: one threadgroup a row

#endif
