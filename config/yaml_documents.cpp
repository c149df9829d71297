#include "config/yaml_documents.h"

#include <yaml-cpp/eventhandler.h>

#include <sstream>

namespace attnops {
namespace {

// Records where each document starts; ignores everything else.
class DocumentStarts : public YAML::EventHandler {
 public:
  YAML::Mark last;
  void OnDocumentStart(const YAML::Mark& mark) override { last = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
  }
  void OnMapEnd() override {}
};

}  // namespace

std::vector<YAML::Node> load_yaml_documents(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  int previous_pos = -1;
  while (parser.HandleNextDocument(starts)) {
    // Two documents cannot start at the same offset: the parser consumed nothing.
    if (starts.last.pos == previous_pos) throw YAML::ParserException(starts.last, "unexpected token here");
    previous_pos = starts.last.pos;
  }
  return YAML::LoadAll(text);
}

}  // namespace attnops
