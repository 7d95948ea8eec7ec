// The start-up feature check (agent/bpf/probe.h) over a fake kernel: each missing feature is
// named with the Linux version that has it, a refused probe asks for privileges, and the
// sched_switch argument count that picks the BPF variant is read from BTF as the kernel lays it
// out (include/trace/bpf_probe.h).
#include <bpf/btf.h>
#include <linux/btf.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "agent/bpf/probe.h"

namespace parascope {
namespace {

// A kernel with everything, minus what a test removes.
class FakeProber : public BpfFeatureProber {
 public:
  std::set<int> missing_prog_types;
  std::set<int> missing_tracing;  // attach types
  std::set<std::pair<int, uint32_t>> missing_maps;  // (type, flags)
  std::set<std::pair<int, int>> missing_helpers;    // (prog type, helper)
  std::set<std::string> missing_btf;
  int sched_switch_args = 4;
  int error = 0;  // returned by every probe when set

  int ProgType(bpf_prog_type type) override {
    return error ? error : !missing_prog_types.count(type);
  }
  int TracingProgram(bpf_attach_type attach, const char* btf_name, int btf_kind) override {
    return error ? error : !missing_tracing.count(attach) && !missing_btf.count(btf_name);
  }
  int MapType(bpf_map_type type, uint32_t flags) override {
    return error ? error : !missing_maps.count({type, flags});
  }
  int Helper(bpf_prog_type type, bpf_func_id helper) override {
    return error ? error : !missing_helpers.count({type, helper});
  }
  int BtfType(const char* name, int kind) override {
    return error ? error : !missing_btf.count(name);
  }
  int TracepointArgs(const char* name) override {
    return error ? error : std::string(name) == "sched_switch" ? sched_switch_args : -ENOENT;
  }
};

TEST_CASE("bpf probe: a kernel with every feature passes") {
  FakeProber p;
  CHECK(CheckBpfFeatures(p).ok());
  p.sched_switch_args = 3;  // before 5.18: the fallback variant, still fine
  CHECK(CheckBpfFeatures(p).ok());
}

TEST_CASE("bpf probe: each missing feature is named with the kernel version that has it") {
  struct Case {
    std::function<void(FakeProber&)> remove;
    std::string message;
  };
  const Case cases[] = {
      {[](FakeProber& p) { p.missing_maps.insert({BPF_MAP_TYPE_RINGBUF, 0}); },
       "this kernel lacks BPF ring buffers (BPF_MAP_TYPE_RINGBUF, Linux 5.8+); parascope needs "
       "Linux 5.10+ with BTF"},
      {[](FakeProber& p) { p.missing_maps.insert({BPF_MAP_TYPE_ARRAY, BPF_F_MMAPABLE}); },
       "this kernel lacks mmap-able BPF arrays (BPF_F_MMAPABLE, Linux 5.5+)"},
      {[](FakeProber& p) { p.missing_tracing.insert(BPF_TRACE_RAW_TP); },
       "this kernel lacks BTF-typed tracepoint programs (tp_btf: BPF_PROG_TYPE_TRACING, "
       "BPF_TRACE_RAW_TP, Linux 5.5+)"},
      {[](FakeProber& p) { p.missing_tracing.insert(BPF_TRACE_ITER); },
       "this kernel lacks BPF task iterators (iter/task: BPF_PROG_TYPE_TRACING, BPF_TRACE_ITER, "
       "Linux 5.8+)"},
      {[](FakeProber& p) { p.missing_prog_types.insert(BPF_PROG_TYPE_PERF_EVENT); },
       "this kernel lacks BPF perf_event programs (BPF_PROG_TYPE_PERF_EVENT"},
      {[](FakeProber& p) {
         p.missing_helpers.insert({BPF_PROG_TYPE_RAW_TRACEPOINT, BPF_FUNC_get_task_stack});
       },
       "this kernel lacks the BPF helper bpf_get_task_stack in tracing programs (Linux 5.9+)"},
      {[](FakeProber& p) {
         p.missing_helpers.insert({BPF_PROG_TYPE_PERF_EVENT, BPF_FUNC_probe_read_user});
       },
       "this kernel lacks the BPF helper bpf_probe_read_user in perf_event programs (Linux "
       "5.5+)"},
      {[](FakeProber& p) { p.missing_btf.insert("bpf_iter_task"); },
       "this kernel lacks the BPF task iterator (iter/task, Linux 5.8+)"},
      {[](FakeProber& p) { p.missing_btf.insert("btf_trace_sched_switch"); },
       "this kernel lacks the sched_switch tracepoint in its BTF (btf_trace_sched_switch"},
  };
  for (const Case& c : cases) {
    FakeProber p;
    c.remove(p);
    absl::Status st = CheckBpfFeatures(p);
    INFO(st.message());
    CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(st.message(), c.message));
  }
}

TEST_CASE("bpf probe: optional helpers are not required") {
  FakeProber p;
  p.missing_helpers.insert({BPF_PROG_TYPE_PERF_EVENT, BPF_FUNC_task_pt_regs});
  p.missing_helpers.insert({BPF_PROG_TYPE_RAW_TRACEPOINT, BPF_FUNC_task_pt_regs});
  CHECK(CheckBpfFeatures(p).ok());
}

TEST_CASE("bpf probe: a refused probe asks for privileges, another failure says what failed") {
  FakeProber p;
  p.error = -EPERM;
  absl::Status st = CheckBpfFeatures(p);
  CHECK(st.code() == absl::StatusCode::kPermissionDenied);
  CHECK(absl::StrContains(st.message(), "CAP_BPF"));
  p.error = -EIO;
  st = CheckBpfFeatures(p);
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(st.message(), "failed: "));
}

// BTF laid out like the kernel's: typedef void (*btf_trace_<tp>)(void *__data, <args>).
btf* TracepointBtf(int args) {
  btf* b = btf__new_empty();
  int u32 = btf__add_int(b, "unsigned int", 4, 0);
  int vptr = btf__add_ptr(b, 0);
  int proto = btf__add_func_proto(b, 0);
  btf__add_func_param(b, "__data", vptr);
  for (int i = 0; i < args; ++i) btf__add_func_param(b, "", u32);
  int ptr = btf__add_ptr(b, proto);
  btf__add_typedef(b, "btf_trace_sched_switch", ptr);
  btf__add_typedef(b, "btf_trace_not_a_function", u32);
  return b;
}

TEST_CASE("bpf probe: sched_switch's arguments are counted from btf_trace_sched_switch") {
  for (int args : {3, 4}) {
    btf* b = TracepointBtf(args);
    REQUIRE(b != nullptr);
    CHECK(TracepointArgCount(b, "sched_switch") == args);
    CHECK(TracepointArgCount(b, "sched_wakeup") == -ENOENT);
    CHECK(TracepointArgCount(b, "not_a_function") == -EINVAL);
    btf__free(b);
  }
}

}  // namespace
}  // namespace parascope
