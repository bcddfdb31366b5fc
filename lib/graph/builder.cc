// GraphBuilder: scoped names and gradient helpers over Graph::add_node.
#include "graph/builder.h"

namespace flowrun {

std::string GraphBuilder::scoped(const std::string& name) const {
  std::string out;
  for (const auto& s : scopes_) out += s + "/";
  return out + name;
}

std::vector<ValueId> GraphBuilder::op(const std::string& type, const std::vector<ValueId>& in, Attrs attrs,
                                      const std::string& name) {
  std::vector<ValueId> out = g_.add_node(type, in, std::move(attrs), scoped(name.empty() ? type : name));
  g_.nodes().back().segment = segment_;
  return out;
}

ValueId GraphBuilder::reduce_to_shape(ValueId grad, Shape target) {
  const Shape s = shape(grad);
  if (s == target) return grad;
  const size_t lead = s.size() - target.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < s.size(); ++i)
    if (i < lead || (target[i - lead] == 1 && s[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  ValueId r = axes.empty() ? grad : reduce_sum(grad, axes, /*keepdims=*/true);
  return reshape(r, target);
}

}  // namespace flowrun
