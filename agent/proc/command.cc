#include "agent/proc/command.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/util/status.h"

namespace parascope::proc {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// execvp(3)'s search, done before fork so that the child only calls async-signal-safe functions.
absl::StatusOr<std::string> Resolve(const std::string& name) {
  if (name.empty()) return absl::NotFoundError("'': command not found");
  if (name.find('/') != std::string::npos) {
    struct stat st {};
    if (stat(name.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat(name, ": ", std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode) || access(name.c_str(), X_OK) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(name, ": not executable"));
    }
    return name;
  }
  const char* env = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(env != nullptr ? env : "/bin:/usr/bin", ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat(name, ": command not found"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Command>> Command::Start(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("no command");
  std::unique_ptr<Command> cmd(new Command());
  PS_ASSIGN_OR_RETURN(cmd->path_, Resolve(argv[0]));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int go[2], err[2];
  if (pipe2(go, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe2");
  if (pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    close(go[0]);
    close(go[1]);
    return ErrnoStatus(e, "pipe2");
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {go[0], go[1], err[0], err[1]}) close(fd);
    return ErrnoStatus(e, "fork");
  }
  if (pid == 0) {
    // The child: async-signal-safe calls only until execve.
    close(go[1]);
    close(err[0]);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    char byte = 0;
    ssize_t n;
    do {
      n = read(go[0], &byte, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1) _exit(127);  // the agent gave up before releasing it
    execve(cmd->path_.c_str(), args.data(), environ);
    const int e = errno;
    (void)!write(err[1], &e, sizeof(e));
    _exit(127);
  }
  close(go[0]);
  close(err[1]);
  cmd->pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  cmd->pid_ = pid;
  cmd->go_fd_ = go[1];
  cmd->error_fd_ = err[0];
  return cmd;
}

Command::~Command() {
  if (go_fd_ >= 0) close(go_fd_);
  if (error_fd_ >= 0) close(error_fd_);
  if (pidfd_ >= 0) close(pidfd_);
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

absl::Status Command::Release() {
  const char byte = 1;
  ssize_t n;
  do {
    n = write(go_fd_, &byte, 1);
  } while (n < 0 && errno == EINTR);
  close(go_fd_);
  go_fd_ = -1;
  if (n != 1) return absl::InternalError(absl::StrCat(path_, ": the child exited before exec"));
  int e = 0;
  do {
    n = read(error_fd_, &e, sizeof(e));
  } while (n < 0 && errno == EINTR);
  close(error_fd_);
  error_fd_ = -1;
  if (n == sizeof(e)) {
    return ErrnoStatus(e, absl::StrCat("cannot run ", path_));
  }
  return absl::OkStatus();  // EOF: execve closed the pipe (O_CLOEXEC)
}

void Command::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

absl::StatusOr<int> Command::Reap() {
  if (pid_ <= 0) return absl::FailedPreconditionError("no command");
  if (!reaped_) {
    int status = 0;
    pid_t r;
    do {
      r = waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    if (r != pid_) return ErrnoStatus(errno, absl::StrCat("waitpid ", path_));
    reaped_ = true;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status)
              : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                    : 1;
  }
  return status_;
}

}  // namespace parascope::proc
