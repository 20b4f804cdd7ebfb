#pragma once
// What one TCP stream can carry over a path, and so how many of a peer's streams to stripe over.
//
// A TCP connection keeps at most one window of unacknowledged bytes in flight, so it moves at
// most window / RTT. The window is bounded by the socket buffers: Linux charges about twice the
// payload to a buffer (sk_buff overhead), which is why getsockopt(SO_SNDBUF) reports twice what
// setsockopt asked for. So the payload window is taken as half the smaller of the send and
// receive buffers: the granted sizes when the transport set them, the autotuning maxima
// (tcp_wmem[2], tcp_rmem[2]) when it left them to the kernel.
//
// Striping: a message is spread over as many streams as the path needs to carry `rate` bits/s,
//   k = clamp(ceil(rate * rtt / window), 1, streams opened),
// and no more: on a short path one stream already fills the link, and every extra flow only
// competes for the same bottleneck queue (measured slower on tbf-shaped links:
// docs/benchmarks-collectives.md). The emulated WAN (pacer.h) models the window itself and
// always spreads chunks over every stream.

#include <cstdint>

namespace lowcomm::transport {

// The payload window of one stream on `fd`; `requested_buffer_bytes` <= 0 means the transport
// left the buffers to the kernel's autotuning.
uint64_t stream_window_bytes(int fd, int requested_buffer_bytes);
// The kernel's smoothed RTT of the connection on `fd` (TCP_INFO), seconds; 0 if unknown.
double kernel_rtt_seconds(int fd);
// The lowest RTT the kernel has measured on the connection on `fd` (TCP_INFO tcpi_min_rtt: the
// SYN exchange and every acknowledged segment since), seconds; 0 if unknown.
double kernel_min_rtt_seconds(int fd);
// Streams to stripe over (see above); at least 1, at most `opened`.
int stripe_streams(double rate_bps, double rtt_s, uint64_t window_bytes, int opened);

}  // namespace lowcomm::transport
