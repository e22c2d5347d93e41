// The two status macros Abseil 20220623 lacks. Every fallible call in the project returns
// absl::Status or absl::StatusOr<T>; these propagate them without exceptions.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ZT_STATUS_CONCAT_INNER(a, b) a##b
#define ZT_STATUS_CONCAT(a, b) ZT_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` is not OK.
#define ZT_RETURN_IF_ERROR(expr)                   \
  do {                                             \
    ::absl::Status zt_status_ = (expr);            \
    if (!zt_status_.ok()) return zt_status_;       \
  } while (false)

// `ZT_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an OK StatusOr, else returns.
#define ZT_ASSIGN_OR_RETURN(lhs, expr) \
  ZT_ASSIGN_OR_RETURN_IMPL(ZT_STATUS_CONCAT(zt_statusor_, __LINE__), lhs, expr)
#define ZT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(tmp).value()
