//! Unit constants and conversions, so no formula carries a bare 1e12 or 1 << 30.

/// Bytes in one GiB (2^30).
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Bytes in one GB (10^9), the unit of vendor bandwidth figures.
pub const GB: f64 = 1e9;
/// FLOP in one TFLOP.
pub const TERA: f64 = 1e12;
/// Seconds in one microsecond.
pub const MICROSECOND: f64 = 1e-6;
/// Bytes per element of a 16-bit (BF16) activation: what the time and the memory model both
/// count a saved or moved activation element as.
pub const ACT_BYTES: f64 = 2.0;
/// Bytes per element of an FP32 tensor (softmax statistics, router scores, logits for the
/// loss, gradients).
pub const FP32_BYTES: f64 = 4.0;

/// Bytes to GiB.
pub fn gib(bytes: f64) -> f64 {
    bytes / GIB
}
