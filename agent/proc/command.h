// Command mode (`parascope [flags] -- CMD ARGS...`, like `perf record -- CMD`): the child process
// that runs CMD. It is forked before the BPF programs are attached and waits; the agent adds it
// to the tree it profiles, then releases it to exec CMD, so CMD's first instruction is recorded.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace parascope::proc {

class Command {
 public:
  // Resolves argv[0] like execvp(3) (a name without '/' is searched in $PATH, default
  // "/bin:/usr/bin", for an executable regular file; unlike execvp, a file without a #! line that
  // the kernel cannot run is not retried with /bin/sh), then forks a child that waits for Release(). Call it while the process has
  // a single thread (fork(2) in a threaded process copies only the caller). The child gets the
  // signal state a shell would give it: nothing blocked, SIGPIPE at its default (execve(2) keeps
  // the mask and ignored signals). Errors: NotFound "CMD: command not found" (a shell's exit
  // status 127), PermissionDenied "CMD: not executable" (126), else the errno of pipe2 or fork.
  static absl::StatusOr<std::unique_ptr<Command>> Start(const std::vector<std::string>& argv);
  // A child still running is killed (SIGKILL) and reaped.
  ~Command();
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;

  pid_t pid() const { return pid_; }
  // The path argv[0] resolved to.
  const std::string& path() const { return path_; }

  // Lets the child exec CMD and returns once it has. Errors: execve(2) failed in the child (the
  // errno as a status naming CMD: NotFound for ENOENT, else another code; the child exits 127);
  // the child died before (Internal: Reap() tells how).
  absl::Status Release();
  // Sends `sig` to the child (kill(2)); nothing once it has been reaped.
  void Signal(int sig);
  // A pidfd of the child (pidfd_open(2), Linux 5.3): readable once it has exited; -1 if it could
  // not be opened.
  int pidfd() const { return pidfd_; }
  // Waits for the child to exit (it blocks until then) and reaps it. Returns its exit status as
  // a shell reports it: the exit code, or 128 + the number of the signal that ended it (wait(2)
  // WIFSIGNALED). Errors: waitpid(2) failed (ECHILD when SIGCHLD is ignored: main sets it to
  // its default).
  absl::StatusOr<int> Reap();

 private:
  Command() = default;
  pid_t pid_ = -1;
  int go_fd_ = -1;     // write end: one byte releases the child, closing it makes it exit
  int error_fd_ = -1;  // read end: the child's execve errno, or EOF once the exec succeeded
  int pidfd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string path_;
};

}  // namespace parascope::proc
