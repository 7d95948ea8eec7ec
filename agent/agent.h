// The daemon: wires the BPF sampler, process table, symbolizers, profile builders and exporters
// together and runs the window loop.
#pragma once

#include <signal.h>

#include "absl/status/status.h"
#include "agent/config/config.h"

namespace parascope {

// Runs the agent until config.duration elapses or SIGINT/SIGTERM arrives; either way the current
// (partial) window is drained and exported before returning OK. Must be called from the main
// thread with SIGINT and SIGTERM blocked (main does this before any other thread exists).
// Errors: a missing privilege or kernel feature (PermissionDenied, FailedPrecondition) or a
// failure to load/attach, with a message saying what to grant or enable.
// In command mode (config.command) it first starts the command (agent/proc/command.h), profiles
// it and its descendants as one tree until it exits, and sets *exit_status to the command's exit
// status (127 when it cannot be found or run, 126 when it is not executable); otherwise
// *exit_status stays 0.
absl::Status RunAgent(const Config& config, int* exit_status);

// The signals the agent handles itself; main() blocks them in every thread before any thread
// exists, and RunAgent reads them from a signalfd(2) between windows. SIGINT, SIGTERM, SIGQUIT,
// SIGUSR1 and SIGUSR2 (whose default action would kill the agent and lose the current window,
// signal(7)) flush the current window and stop; SIGHUP is logged and ignored: the configuration
// is read once at start.
sigset_t HandledSignals();

}  // namespace parascope
