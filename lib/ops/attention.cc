// Placeholder registration, replaced by the op family's real definitions.
#include "ops/registry.h"
namespace flowrun {
void register_attention_ops(OpRegistry&) {}
}  // namespace flowrun
