// Reads exported files with PyTorch and a safetensors parser written from the format's
// definition (json + torch.frombuffer), so the bytes are proven readable outside our code.
// Skipped where /usr/bin/python3 has no torch. One Python process reads every file: importing
// torch takes seconds.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/worker/checkpoint/checkpoint_test_util.h"
#include "tests/unit/worker/checkpoint/hf_test_names.h"
#include "worker/checkpoint/hf_interop.h"

namespace zt {
namespace {

using testing_util::Gpt2Sources;
using testing_util::HfOrderValues;
using testing_util::HfSource;
using testing_util::LlamaSources;
using testing_util::RoundToSignificantBits;
using testing_util::ScratchDir;
using testing_util::TinyGpt2;
using testing_util::TinyLlama;
using testing_util::UnitBuffers;

constexpr const char* kPython = "/usr/bin/python3";

// Prints, as JSON, the metadata and for each tensor its dtype, shape, plain sum and
// position-weighted sum (Σ (j+1)·x_j over the row-major order, which a transposed or shifted
// tensor fails), all in float64.
constexpr const char* kReader = R"PY(
import json, struct, sys
try:
    import torch
except ImportError:
    print(json.dumps({"no_torch": True}))
    sys.exit(0)

def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "data must start 8-byte aligned"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    end = 0
    out = {"metadata": meta, "tensors": {}}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = info["data_offsets"]
        assert b == end, "tensors must be packed back to back"
        end = e
        t = torch.frombuffer(bytearray(data[b:e]), dtype=dtypes[info["dtype"]])
        t = t.reshape(info["shape"]).double()
        flat = t.flatten()
        w = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
        out["tensors"][name] = {"dtype": info["dtype"], "shape": list(t.shape),
                                "sum": flat.sum().item(), "wsum": (flat * w).sum().item()}
    assert end == len(data), "no bytes after the last tensor"
    return out

print(json.dumps({path: read(path) for path in sys.argv[1:]}))
)PY";

// Runs the reader on `files`; the parsed JSON (keyed by file), or a discarded value.
nlohmann::json ReadWithTorch(const ScratchDir& dir, const std::vector<std::string>& files) {
  const std::string script = dir.Path("reader.py");
  std::ofstream(script) << kReader;
  std::string cmd = std::string(kPython) + " " + script;
  for (const std::string& f : files) cmd += " " + f;
  cmd += " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return nlohmann::json::value_t::discarded;
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  const int rc = ::pclose(pipe);
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_FALSE(j.is_discarded()) << out;
  return j;
}

struct ExportCase {
  const char* label;
  zerotrain::ModelConfig model;
  std::vector<HfSource> sources;
  DType dtype;
  const char* dtype_name;
  int significant_bits;  // what the dtype keeps of the f32 values UnitBuffers draws
};

// Checks what torch read from one export against the parameters it was written from.
void ExpectMatches(const nlohmann::json& got, const ExportCase& c, const ModelLayout& layout,
                   const UnitBuffers& params) {
  EXPECT_EQ(got["metadata"], nlohmann::json({{"format", "pt"}}));
  ASSERT_EQ(got["tensors"].size(), c.sources.size());
  for (const HfSource& src : c.sources) {
    SCOPED_TRACE(src.name);
    ASSERT_TRUE(got["tensors"].contains(src.name));
    const nlohmann::json& t = got["tensors"][src.name];
    EXPECT_EQ(t["dtype"], c.dtype_name);
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), src.shape);
    double sum = 0, wsum = 0, abs_wsum = 0;
    const std::vector<double> v = HfOrderValues(layout, src, params.Const());
    for (size_t j = 0; j < v.size(); ++j) {
      const double x = RoundToSignificantBits(v[j], c.significant_bits);
      sum += x;
      wsum += static_cast<double>(j + 1) * x;
      abs_wsum += static_cast<double>(j + 1) * std::abs(x);
    }
    // Both sides add the same float64 terms, possibly in another order (torch reduces
    // pairwise): reassociation error stays below n·eps·Σ|terms|, n ≤ 2^10 here.
    const double tol = 1024 * 2.3e-16 * abs_wsum;
    EXPECT_NEAR(t["sum"].get<double>(), sum, tol);
    EXPECT_NEAR(t["wsum"].get<double>(), wsum, tol);
  }
}

TEST(HfInteropTorchTest, TorchReadsExportedFiles) {
  const zerotrain::ModelConfig gpt2 = TinyGpt2(/*tied=*/true);
  const zerotrain::ModelConfig llama = TinyLlama(/*tied=*/false);
  const zerotrain::ModelConfig llama_tied = TinyLlama(/*tied=*/true);
  // 8, 24 and 11 significant bits: bf16, f32 (unrounded), f16 normals.
  const std::vector<ExportCase> cases = {
      {"gpt2_tied_bf16", gpt2, Gpt2Sources(gpt2, "transformer."), DType::kBF16, "BF16", 8},
      {"llama_untied_f32", llama, LlamaSources(llama), DType::kF32, "F32", 24},
      {"llama_tied_f16", llama_tied, LlamaSources(llama_tied), DType::kF16, "F16", 11},
  };
  ScratchDir dir;
  std::vector<ModelLayout> layouts;
  std::vector<UnitBuffers> params;
  std::vector<std::string> files;
  for (const ExportCase& c : cases) {
    layouts.push_back(BuildModelLayout(c.model));
    params.emplace_back(layouts.back(), 5);
    files.push_back(dir.Path(std::string(c.label) + ".safetensors"));
    const absl::Status s =
        ExportHuggingFace(files.back(), c.model, layouts.back(), params.back().Const(), c.dtype);
    ASSERT_TRUE(s.ok()) << s;
  }
  const nlohmann::json got = ReadWithTorch(dir, files);
  ASSERT_TRUE(got.is_object());
  if (got.contains("no_torch")) GTEST_SKIP() << kPython << " cannot import torch";
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].label);
    ASSERT_TRUE(got.contains(files[i]));
    ExpectMatches(got[files[i]], cases[i], layouts[i], params[i]);
  }
}

}  // namespace
}  // namespace zt
