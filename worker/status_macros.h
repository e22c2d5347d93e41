// ZT_RETURN_IF_ERROR / ZT_ASSIGN_OR_RETURN for the layers above worker/ (daemon/, cli/), which
// may not include kernels/ (DESIGN.md). One definition: kernels/status_macros.h.
#pragma once

#include "kernels/status_macros.h"  // IWYU pragma: export
