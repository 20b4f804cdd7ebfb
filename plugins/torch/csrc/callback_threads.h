#pragma once
// CallbackThreads: where a work's future is completed when someone holds the future (torch's
// Future.then, DDP communication hooks). Its callbacks are user code: they may issue a collective
// and wait for it, or wait for a later operation's future, which completes only once lowcomm's
// executor has run that operation, so they must never run on the executor. Each task runs on an
// idle thread of a process-wide set, or on a new one when none is idle (a callback that blocks
// on a later work's future holds its thread while the later work completes on another), so no
// task waits behind a blocked one. Threads idle for a while leave. Works nobody asked a future
// of complete on the executor as before, without a hand-off.

#include <functional>

namespace lowcomm::torch_backend {

// Runs `task` soon on a thread of the set (never on the calling thread).
void run_on_callback_thread(std::function<void()> task);

}  // namespace lowcomm::torch_backend
