// Status helpers missing from Debian's Abseil 20220623 (no status macros there).
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define PS_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status ps_status_ = (expr);          \
    if (!ps_status_.ok()) return ps_status_;     \
  } while (0)

#define PS_CONCAT_INNER_(a, b) a##b
#define PS_CONCAT_(a, b) PS_CONCAT_INNER_(a, b)

// `PS_ASSIGN_OR_RETURN(auto x, StatusOrExpr());` declares/assigns `x` or returns the error.
#define PS_ASSIGN_OR_RETURN(lhs, expr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_CONCAT_(ps_statusor_, __LINE__), lhs, expr)
#define PS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

namespace parascope {

// Maps an errno value to the closest absl status code, keeping strerror text and `context`.
absl::Status ErrnoStatus(int err, absl::string_view context);

}  // namespace parascope
