// Helpers for root end-to-end tests: child processes with pipes, the real pprof tool's -raw
// output parsed into samples, and the root gate ([root] tests fail instead of skipping in CI).
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace parascope::testing {

// True when running as root. Otherwise: in CI (CI=true) a Catch2 FAIL, elsewhere a WARN and
// false, so the caller returns (Catch2 v2 has no SKIP).
bool RequireRoot();
// [root] tests RequireRoot skipped in this run; root_main.cc then exits kSkippedExitCode, which
// ctest shows as skipped (SKIP_RETURN_CODE), not as passed.
int RootTestsSkipped();
inline constexpr int kSkippedExitCode = 77;

// A child process with its stdin, stdout and stderr on pipes.
class Child {
 public:
  // fork + execv(argv[0], argv). Aborts the test on failure.
  explicit Child(const std::vector<std::string>& argv);
  ~Child();  // closes pipes, SIGKILLs and reaps the child if still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Reads one line (without '\n') from stdout or stderr, waiting at most timeout_s. Returns
  // false on EOF or timeout; every byte read is also appended to the transcript.
  bool ReadStdoutLine(std::string* line, int timeout_s = 60);
  bool ReadStderrLine(std::string* line, int timeout_s = 60);
  // Reads stderr lines until one contains `needle`; false on EOF/timeout.
  bool WaitForStderr(const std::string& needle, std::string* line, int timeout_s = 60);
  void WriteStdin(const std::string& data);
  void CloseStdin();
  // Waits for exit (at most timeout_s, then SIGKILL) and returns the exit status as from
  // waitpid; collects the rest of stdout/stderr into the transcripts.
  int Wait(int timeout_s = 120);
  // True while the child has not exited (does not reap it: Wait still works).
  bool Running() const;
  const std::string& stdout_text() const { return out_text_; }
  const std::string& stderr_text() const { return err_text_; }

 private:
  bool ReadLine(int fd, std::string* buf, std::string* transcript, std::string* line,
                int timeout_s);
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  std::string out_buf_, err_buf_, out_text_, err_text_;
};

// Runs a shell command, returning its exit status and stdout (stderr is appended to *err).
int RunCommand(const std::string& command, std::string* out, std::string* err = nullptr);

// One profile as the real pprof tool prints it with -raw.
struct RawProfile {
  struct Sample {
    std::vector<int64_t> values;
    std::vector<uint64_t> location_ids;  // leaf first
    std::map<std::string, std::string> labels;
  };
  struct Line {
    std::string function;
    // The Function's system_name: pprof prints it only when it differs from the name, else it
    // is the name.
    std::string system_name;
    std::string file;  // "" if unknown
    int64_t line = 0;  // 0 if unknown
  };
  struct Location {
    uint64_t mapping_id = 0;
    std::string function;     // innermost function name, "" if unsymbolized
    std::vector<Line> lines;  // innermost first; the last is the function the others are
                              // inlined into
  };
  std::vector<std::string> sample_types;  // e.g. "samples/count", "cpu/nanoseconds"
  std::string period_type;
  int64_t period = 0;
  // time_nanos and duration_nanos (0 if absent). pprof -raw prints "Time:" in full but
  // "Duration:" with %.4v, which cuts the Go duration string to four characters ("2s" and "1m0s"
  // survive, "2.000729s" becomes "2.00"), so ReadWithPprof takes the exact values from fields 9
  // and 10 of the file itself and checks them against what pprof printed. duration_text keeps
  // pprof's text.
  int64_t time_nanos = 0;
  int64_t duration_nanos = 0;
  std::string duration_text;
  std::vector<Sample> samples;
  std::map<uint64_t, Location> locations;
  std::map<uint64_t, std::string> mapping_files;

  int ValueIndex(const std::string& type) const;
  int64_t Total(int value_index) const;
  // Function names of a sample's frames, leaf first ("" for unsymbolized frames); a Location with
  // inlined functions gives one frame per Line, as pprof shows them.
  std::vector<std::string> Frames(const Sample& s) const;
  bool IsKernelFrame(uint64_t location_id) const;
};

// Runs `pprof -raw -symbolize=none FILE` (PS_PPROF_BIN: the names the agent wrote, none that
// pprof would look up itself) and parses it. Test failure if pprof fails.
RawProfile ReadWithPprof(const std::string& path);

// A complete Go duration string ("2s", "1m0s", "1.5ms", "250µs") in ns; -1 if it is not one
// (e.g. cut short by pprof's %.4v).
int64_t ParseGoDuration(const std::string& text);

// "key=value" tokens of a line such as a workload's "done tid=12 cpu_ns=34" (other tokens are
// ignored).
std::map<std::string, std::string> KeyValues(const std::string& line);

// The value of one series in Prometheus text exposition format (the agent's /metrics), named
// with its labels exactly as exposed, e.g. `parascope_queue_bytes` or
// `parascope_queue_dropped_total{reason="queue_full"}`; -1 if absent.
double MetricValue(const std::string& text, const std::string& series);
// The agent's /metrics text from 127.0.0.1:`port` (in-process HTTP GET, 10 s timeouts); "" when
// unreachable.
std::string Scrape(int port);
// The port of the agent's HTTP server (--http-address=127.0.0.1:0 lets the kernel choose it)
// from its "serving /metrics ... (port N)" log line in `agent_stderr`, the only place that says
// it; 0 if there is none.
int MetricsPort(const std::string& agent_stderr);
// Reads the agent's stderr up to its "attached:" line (at most 60 s per line) and returns the
// port of the "serving /metrics" line before it; 0 if there was none, or no "attached:" line.
int AttachedMetricsPort(Child* agent);

// Files under dir matching "<dir>/<pid>/<start ticks>.<exec id>/<prefix>*.pb.gz" (pid 0 = any).
std::vector<std::string> ProfileFiles(const std::string& dir, int pid, const std::string& prefix);

// A fresh temporary directory, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace parascope::testing
