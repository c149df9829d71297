#include "attnops/mask.h"

#include <algorithm>

#include "attnops/error.h"

namespace attnops {

struct Mask::Node {
  Kind kind = Kind::full;
  std::int64_t left = 0, right = 0, chunk = 0;
  std::int64_t q_offset = 0, k_offset = 0, outer_tq = 0, outer_tk = 0;  // offset
  std::vector<Mask> children;
  std::string key;
  bool head_dependent = false;
  std::int64_t num_heads = 0;
};

namespace {
using Interval = std::pair<std::int64_t, std::int64_t>;
std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
}  // namespace

Mask::Mask() : Mask(full()) {}
Mask::Mask(std::shared_ptr<const Node> n) : node_(std::move(n)) {}

Mask Mask::full() {
  static const std::shared_ptr<const Node> n = [] {
    auto x = std::make_shared<Node>();
    x->key = "full";
    return x;
  }();
  return Mask(n);
}

Mask Mask::causal() {
  // One node for the process, as full(): nodes are immutable, and a call allocates nothing for it.
  static const std::shared_ptr<const Node> n = [] {
    auto x = std::make_shared<Node>();
    x->kind = Kind::causal;
    x->key = "causal";
    return x;
  }();
  return Mask(n);
}

Mask Mask::local(std::int64_t left, std::int64_t right) {
  if (left < 0 || right < 0)
    throw Error(ErrorCode::invalid_argument, "Mask::local: window (left, right) must be >= 0, got (" +
                                                 std::to_string(left) + ", " + std::to_string(right) + ")");
  auto n = std::make_shared<Node>();
  n->kind = Kind::local;
  n->left = left;
  n->right = right;
  n->key = "local(" + std::to_string(left) + "," + std::to_string(right) + ")";
  return Mask(n);
}

Mask Mask::chunked_causal(std::int64_t chunk) {
  if (chunk < 1)
    throw Error(ErrorCode::invalid_argument,
                "Mask::chunked_causal: chunk must be >= 1, got " + std::to_string(chunk));
  auto n = std::make_shared<Node>();
  n->kind = Kind::chunked_causal;
  n->chunk = chunk;
  n->key = "chunk(" + std::to_string(chunk) + ")";
  return Mask(n);
}

namespace {
// Two head-dependent masks combined (a & b, a | b, or per_head of per_head masks) must be built
// for the same number of q heads: otherwise some heads would silently reuse another head's mask.
void require_same_heads(const char* op, std::int64_t a, std::int64_t b) {
  if (a != 0 && b != 0 && a != b)
    throw Error(ErrorCode::shape_mismatch,
                std::string(op) + ": per_head masks built for " + std::to_string(a) + " and " +
                    std::to_string(b) +
                    " q heads cannot be combined; give every per_head mask one mask "
                    "per q head (Hq)");
}

// The mask of q head h in a per_head node (make_problem checks that there is one per q head).
const Mask& head_mask(const std::vector<Mask>& heads, std::int64_t h) {
  if (h < 0 || static_cast<std::size_t>(h) >= heads.size())
    throw Error(ErrorCode::internal, "Mask: q head " + std::to_string(h) + " of a per_head mask built for " +
                                         std::to_string(heads.size()) + " heads");
  return heads[static_cast<std::size_t>(h)];
}
}  // namespace

Mask Mask::per_head(std::vector<Mask> heads) {
  if (heads.empty())
    throw Error(ErrorCode::invalid_argument, "Mask::per_head: needs one mask per q head, got none");
  for (const Mask& m : heads)
    require_same_heads("Mask::per_head (a head's own mask is per_head)",
                       static_cast<std::int64_t>(heads.size()), m.num_heads());
  bool same =
      std::all_of(heads.begin(), heads.end(), [&](const Mask& m) { return m.key() == heads[0].key(); });
  if (same) return heads[0];
  auto n = std::make_shared<Node>();
  n->kind = Kind::per_head;
  n->key = "heads[";
  for (std::size_t i = 0; i < heads.size(); ++i) {
    if (i) n->key += ',';
    n->key += heads[i].key();
  }
  n->key += "]";
  n->head_dependent = true;
  n->num_heads = static_cast<std::int64_t>(heads.size());
  n->children = std::move(heads);
  return Mask(n);
}

// a & b, a | b: one node holding the flattened operands (nested nodes of the same kind merge).
Mask Mask::combine(Kind kind, const Mask& a, const Mask& b) {
  auto n = std::make_shared<Node>();
  n->kind = kind;
  for (const Mask* m : {&a, &b}) {
    if (m->kind() == kind)
      n->children.insert(n->children.end(), m->children().begin(), m->children().end());
    else
      n->children.push_back(*m);
  }
  const char sep = kind == Kind::all_of ? '&' : '|';
  std::string key(1, '(');
  for (std::size_t i = 0; i < n->children.size(); ++i) {
    if (i) key.push_back(sep);
    key.append(n->children[i].key());
    n->head_dependent = n->head_dependent || n->children[i].head_dependent();
    require_same_heads(kind == Kind::all_of ? "Mask &" : "Mask |", n->num_heads, n->children[i].num_heads());
    n->num_heads = std::max(n->num_heads, n->children[i].num_heads());
  }
  key.push_back(')');
  n->key = std::move(key);
  return Mask(n);
}

Mask Mask::operator&(const Mask& other) const {
  if (kind() == Kind::full) return other;
  if (other.kind() == Kind::full || key() == other.key()) return *this;
  return combine(Kind::all_of, *this, other);
}

Mask Mask::operator|(const Mask& other) const {
  if (kind() == Kind::full || other.kind() == Kind::full) return full();
  if (key() == other.key()) return *this;
  return combine(Kind::any_of, *this, other);
}

Mask Mask::at_offset(std::int64_t q_offset, std::int64_t k_offset, std::int64_t Tq, std::int64_t Tk) const {
  if (q_offset < 0 || k_offset < 0 || Tq < 0 || Tk < 0)
    throw Error(ErrorCode::invalid_argument,
                "Mask::at_offset: offsets and the outer (Tq, Tk) must be >= 0, got (" +
                    std::to_string(q_offset) + ", " + std::to_string(k_offset) + ", " + std::to_string(Tq) +
                    ", " + std::to_string(Tk) + ")");
  auto n = std::make_shared<Node>();
  n->kind = Kind::offset;
  n->q_offset = q_offset;
  n->k_offset = k_offset;
  n->outer_tq = Tq;
  n->outer_tk = Tk;
  n->key = "offset(" + std::to_string(q_offset) + "," + std::to_string(k_offset) + "," + std::to_string(Tq) +
           "," + std::to_string(Tk) + ":" + key() + ")";
  n->head_dependent = head_dependent();
  n->num_heads = num_heads();
  n->children.push_back(*this);
  return Mask(n);
}

Mask::Kind Mask::kind() const {
  return node_->kind;
}
std::int64_t Mask::left() const {
  return node_->left;
}
std::int64_t Mask::right() const {
  return node_->right;
}
std::int64_t Mask::chunk() const {
  return node_->chunk;
}
std::int64_t Mask::q_offset() const {
  return node_->q_offset;
}
std::int64_t Mask::k_offset() const {
  return node_->k_offset;
}
std::int64_t Mask::outer_tq() const {
  return node_->outer_tq;
}
std::int64_t Mask::outer_tk() const {
  return node_->outer_tk;
}
const std::vector<Mask>& Mask::children() const {
  return node_->children;
}
bool Mask::head_dependent() const {
  return node_->head_dependent;
}
std::int64_t Mask::num_heads() const {
  return node_->num_heads;
}
const std::string& Mask::key() const {
  return node_->key;
}

bool Mask::visible(std::int64_t h, std::int64_t i, std::int64_t j, std::int64_t Tq, std::int64_t Tk) const {
  const std::int64_t p = i + Tk - Tq;
  switch (node_->kind) {
    case Kind::full:
      return true;
    case Kind::causal:
      return j <= p;
    case Kind::local:
      return j >= p - node_->left && j <= p + node_->right;
    case Kind::chunked_causal:
      return j <= p && floor_div(j, node_->chunk) == floor_div(p, node_->chunk);
    case Kind::per_head: {
      const auto& c = node_->children;
      return head_mask(c, h).visible(h, i, j, Tq, Tk);
    }
    case Kind::all_of:
      for (const auto& c : node_->children)
        if (!c.visible(h, i, j, Tq, Tk)) return false;
      return true;
    case Kind::any_of:
      for (const auto& c : node_->children)
        if (c.visible(h, i, j, Tq, Tk)) return true;
      return false;
    case Kind::offset: {
      const Node& n = *node_;
      const std::int64_t gi = n.q_offset + i, gj = n.k_offset + j;
      if (gi < 0 || gi >= n.outer_tq || gj < 0 || gj >= n.outer_tk) return false;
      return n.children[0].visible(h, gi, gj, n.outer_tq, n.outer_tk);
    }
  }
  return false;
}

std::optional<Interval> Mask::row_interval(std::int64_t h, std::int64_t i, std::int64_t Tq,
                                           std::int64_t Tk) const {
  const std::int64_t p = i + Tk - Tq;
  auto clip = [&](std::int64_t lo, std::int64_t hi) {
    lo = std::clamp<std::int64_t>(lo, 0, Tk);
    hi = std::clamp<std::int64_t>(hi, 0, Tk);
    if (hi < lo) hi = lo;
    return Interval{lo, hi};
  };
  switch (node_->kind) {
    case Kind::full:
      return Interval{0, Tk};
    case Kind::causal:
      return clip(0, p + 1);
    case Kind::local:
      return clip(p - node_->left, p + node_->right + 1);
    case Kind::chunked_causal:
      if (p < 0) return Interval{0, 0};
      return clip(floor_div(p, node_->chunk) * node_->chunk, p + 1);
    case Kind::per_head: {
      const auto& c = node_->children;
      return head_mask(c, h).row_interval(h, i, Tq, Tk);
    }
    case Kind::all_of: {
      Interval r{0, Tk};
      for (const auto& c : node_->children) {
        auto x = c.row_interval(h, i, Tq, Tk);
        if (!x) return std::nullopt;
        r.first = std::max(r.first, x->first);
        r.second = std::min(r.second, x->second);
      }
      if (r.second < r.first) r.second = r.first;
      return r;
    }
    case Kind::any_of: {
      std::vector<Interval> parts;
      for (const auto& c : node_->children) {
        auto x = c.row_interval(h, i, Tq, Tk);
        if (!x) return std::nullopt;
        if (x->second > x->first) parts.push_back(*x);
      }
      if (parts.empty()) return Interval{0, 0};
      std::sort(parts.begin(), parts.end());
      Interval r = parts[0];
      for (std::size_t k = 1; k < parts.size(); ++k) {
        if (parts[k].first > r.second) return std::nullopt;  // a gap: not an interval
        r.second = std::max(r.second, parts[k].second);
      }
      return r;
    }
    case Kind::offset: {
      const Node& n = *node_;
      const std::int64_t gi = n.q_offset + i;
      if (gi < 0 || gi >= n.outer_tq) return Interval{0, 0};
      auto x = n.children[0].row_interval(h, gi, n.outer_tq, n.outer_tk);  // clipped to [0, outer_tk)
      if (!x) return std::nullopt;
      return clip(x->first - n.k_offset, x->second - n.k_offset);
    }
  }
  return std::nullopt;
}

}  // namespace attnops
