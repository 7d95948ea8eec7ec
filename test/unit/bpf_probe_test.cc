// The sched_switch argument count that picks the BPF variant, read from BTF as the kernel lays
// it out (include/trace/bpf_probe.h).
#include <bpf/btf.h>
#include <linux/btf.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <string>

#include "agent/bpf/probe.h"

namespace parascope {
namespace {

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
