#include "worker/job/job_validation.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "kernels/nf4.h"
#include "worker/job/data_paths.h"
#include "worker/job/lora_validation.h"
#include "worker/job/offload_validation.h"
#include "worker/job/parallel_validation.h"

namespace zt {
namespace {

constexpr int kMaxLayers = 4096;

using zerotrain::JobSpec;
using zerotrain::ModelConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;
using zerotrain::ResourceConfig;

constexpr size_t kMaxNameChars = 128;

// Collects violation lines; the caller turns them into one status.
class Violations {
 public:
  void Add(std::string line) { lines_.push_back(std::move(line)); }
  bool empty() const { return lines_.empty(); }
  std::string Join() const { return absl::StrJoin(lines_, "\n"); }

  void AtLeast(absl::string_view field, int64_t value, int64_t min) {
    if (value < min) Add(absl::StrCat(field, ": must be >= ", min, " (got ", value, ")"));
  }

  // `rule` is printed as written, e.g. "> 0"; the predicate decides.
  void Real(absl::string_view field, float value, bool ok, absl::string_view rule) {
    if (!std::isfinite(value)) {
      Add(absl::StrCat(field, ": must be a finite number ", rule, " (got ", value, ")"));
    } else if (!ok) {
      Add(absl::StrCat(field, ": must be ", rule, " (got ", value, ")"));
    }
  }
  void Positive(absl::string_view field, float value) { Real(field, value, value > 0, "> 0"); }
  void NonNegative(absl::string_view field, float value) { Real(field, value, value >= 0, ">= 0"); }
  void UnitHalfOpen(absl::string_view field, float value) {
    Real(field, value, value >= 0 && value < 1, "in [0, 1)");
  }

  // Optional fields are completed by ApplyJobDefaults; one still unset means it did not run.
  bool Set(absl::string_view field, bool has) {
    if (!has) Add(absl::StrCat(field, ": not set (ApplyJobDefaults must run before validation)"));
    return has;
  }

 private:
  std::vector<std::string> lines_;
};

template <typename EnumName>
std::string NameOf(int value, EnumName name_of) {
  const std::string name = name_of(value);
  return name.empty() ? absl::StrCat(value) : name;
}

void ValidateName(const std::string& name, Violations& v) {
  // The name starts the job's id, run directory and metric labels: it must say something.
  if (name.empty()) {
    v.Add(absl::StrCat("name: required: 1 to ", kMaxNameChars, " characters of [A-Za-z0-9._-]"));
    return;
  }
  if (name.size() > kMaxNameChars) {
    v.Add(absl::StrCat("name: '", absl::CHexEscape(name.substr(0, 40)), "...' has ", name.size(),
                       " characters; at most ", kMaxNameChars, " are allowed"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      v.Add(absl::StrCat("name: may hold only [A-Za-z0-9._-], found byte 0x",
                         absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2), " at position ",
                         i));
      return;
    }
  }
}

bool IsControl(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }

void CheckNoControl(const std::string& field, const std::string& value, Violations& v) {
  for (size_t i = 0; i < value.size(); ++i) {
    if (!IsControl(value[i])) continue;
    v.Add(absl::StrCat(field, ": '", absl::CHexEscape(value), "' holds control character 0x",
                       absl::Hex(static_cast<unsigned char>(value[i]), absl::kZeroPad2),
                       " at position ", i,
                       "; names and paths may hold none (bytes below 0x20, "
                       "and 0x7f)"));
    return;
  }
}

// Every string field of `message` at any depth, found by reflection so that a field added to
// the schema is covered without a line here; `prefix` is the message's own path ("data").
// A NUL would cut a path short where a C API reads it, a newline forges log and event lines.
void ValidateStrings(const google::protobuf::Message& message, const std::string& prefix,
                     Violations& v) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (path == "name") continue;  // ValidateName's rule is narrower still
    const bool text = f->type() == FieldDescriptor::TYPE_STRING;
    const bool nested = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (!text && !nested) continue;
    if (!f->is_repeated()) {
      if (text) CheckNoControl(path, reflection->GetString(message, f), v);
      if (nested) ValidateStrings(reflection->GetMessage(message, f), path, v);
      continue;
    }
    for (int i = 0; i < reflection->FieldSize(message, f); ++i) {
      const std::string item = absl::StrCat(path, "[", i, "]");
      if (text) CheckNoControl(item, reflection->GetRepeatedString(message, f, i), v);
      if (nested) ValidateStrings(reflection->GetRepeatedMessage(message, f, i), item, v);
    }
  }
}

void ValidateModel(const JobSpec& spec, Violations& v) {
  const ModelConfig& m = spec.model();
  const bool gpt2 = m.family() == ModelConfig::GPT2;
  const bool llama = m.family() == ModelConfig::LLAMA;
  if (!gpt2 && !llama) {
    v.Add(absl::StrCat("model.family: must be GPT2 or LLAMA (got ",
                       NameOf(m.family(), ModelConfig::Family_Name<int>), ")"));
  }
  v.AtLeast("model.n_layer", m.n_layer(), 1);
  // The layout, the plan and the planner hold entries per block: a bound keeps a hostile job
  // from exhausting a daemon's memory (the largest published models have under 200 blocks).
  if (m.n_layer() > kMaxLayers) {
    v.Add(absl::StrCat("model.n_layer: must be <= ", kMaxLayers, " (got ", m.n_layer(), ")"));
  }
  v.AtLeast("model.n_head", m.n_head(), 1);
  v.AtLeast("model.d_model", m.d_model(), 1);
  if (m.n_head() >= 1 && m.d_model() >= 1) {
    if (m.d_model() % m.n_head() != 0) {
      v.Add(absl::StrCat("model.d_model: ", m.d_model(), " is not divisible by model.n_head ",
                         m.n_head()));
    } else if (llama && (m.d_model() / m.n_head()) % 2 != 0) {
      // RoPE rotates channel pairs of each head.
      v.Add(absl::StrCat("model.d_model: LLAMA needs an even head size for RoPE (d_model ",
                         m.d_model(), " / n_head ", m.n_head(), " = ", m.d_model() / m.n_head(),
                         ")"));
    }
  }
  if (v.Set("model.n_kv_head", m.has_n_kv_head())) {
    v.AtLeast("model.n_kv_head", m.n_kv_head(), 1);
    if (gpt2 && m.n_kv_head() >= 1 && m.n_kv_head() != m.n_head()) {
      v.Add(absl::StrCat("model.n_kv_head: GPT2 requires n_kv_head == n_head (got ", m.n_kv_head(),
                         ", n_head ", m.n_head(), ")"));
    } else if (m.n_kv_head() >= 1 && m.n_head() >= 1 && m.n_head() % m.n_kv_head() != 0) {
      v.Add(absl::StrCat("model.n_head: ", m.n_head(), " is not divisible by model.n_kv_head ",
                         m.n_kv_head()));
    }
  }
  if (m.has_d_ff()) {
    v.AtLeast("model.d_ff", m.d_ff(), 1);
  } else if ((gpt2 || llama) && m.d_model() >= 1) {
    v.Add(absl::StrCat("model.d_ff: not set, and its default from model.d_model ", m.d_model(),
                       " does not fit in int32 (or ApplyJobDefaults did not run)"));
  }
  v.AtLeast("model.vocab_size", m.vocab_size(), 2);
  v.AtLeast("model.max_seq_len", m.max_seq_len(), 1);
  if (gpt2 || llama) v.Set("model.tie_embeddings", m.has_tie_embeddings());
  if (v.Set("model.norm_eps", m.has_norm_eps())) v.Positive("model.norm_eps", m.norm_eps());
  if (v.Set("model.rope_theta", m.has_rope_theta())) {
    v.Positive("model.rope_theta", m.rope_theta());
  }
  if (v.Set("model.init_std", m.has_init_std())) v.Positive("model.init_std", m.init_std());
}

void ValidateData(const JobSpec& spec, Violations& v) {
  const zerotrain::DataConfig& d = spec.data();
  if (d.train().empty()) v.Add("data.train: at least one file is required");
  auto check_entry = [&](const std::string& field, const std::string& entry) {
    if (entry.empty()) v.Add(absl::StrCat(field, ": the path is empty"));
    if (IsDataPattern(DataPatternDirectory(entry))) {
      v.Add(absl::StrCat(field, ": '", entry,
                         "' has a wildcard in its directory part; only the file name may be a "
                         "pattern (the directory is what the allowed roots are checked against)"));
    }
  };
  for (int i = 0; i < d.train_size(); ++i) {
    check_entry(absl::StrCat("data.train[", i, "]"), d.train(i));
  }
  for (int i = 0; i < d.val_size(); ++i) check_entry(absl::StrCat("data.val[", i, "]"), d.val(i));
  v.AtLeast("data.seq_len", d.seq_len(), 1);
  if (d.seq_len() >= 1 && spec.model().max_seq_len() >= 1 &&
      d.seq_len() > spec.model().max_seq_len()) {
    v.Add(absl::StrCat("data.seq_len: ", d.seq_len(), " exceeds model.max_seq_len ",
                       spec.model().max_seq_len()));
  }
  v.Set("data.seed", d.has_seed());
}

void ValidateTrain(const JobSpec& spec, Violations& v) {
  const zerotrain::TrainConfig& t = spec.train();
  v.AtLeast("train.micro_batch_size", t.micro_batch_size(), 1);
  if (v.Set("train.grad_accum_steps", t.has_grad_accum_steps())) {
    v.AtLeast("train.grad_accum_steps", t.grad_accum_steps(), 1);
  }
  v.AtLeast("train.max_steps", t.max_steps(), 1);
  v.AtLeast("train.eval_interval", t.eval_interval(), 0);
  if (v.Set("train.eval_steps", t.has_eval_steps()) && t.eval_interval() > 0 &&
      t.eval_steps() < 1) {
    v.Add(absl::StrCat("train.eval_steps: must be >= 1 when train.eval_interval > 0 (got ",
                       t.eval_steps(), ", eval_interval ", t.eval_interval(), ")"));
  }
  // "Every this many steps": 0 would be a division by zero, not "never".
  if (v.Set("train.log_interval", t.has_log_interval())) {
    v.AtLeast("train.log_interval", t.log_interval(), 1);
  }
  v.Set("train.seed", t.has_seed());
}

void ValidateOptimizer(const JobSpec& spec, Violations& v) {
  const OptimizerConfig& o = spec.optimizer();
  if (o.type() != OptimizerConfig::ADAMW && o.type() != OptimizerConfig::SGD &&
      o.type() != OptimizerConfig::ADAMW_8BIT && o.type() != OptimizerConfig::ADAFACTOR) {
    v.Add(absl::StrCat("optimizer.type: must be ADAMW, SGD, ADAMW_8BIT or ADAFACTOR (got ",
                       NameOf(o.type(), OptimizerConfig::Type_Name<int>), ")"));
  }
  if (v.Set("optimizer.quant_block_size", o.has_quant_block_size())) {
    const int32_t b = o.quant_block_size();
    if (b < 64 || (b & (b - 1)) != 0) {
      v.Add(absl::StrCat("optimizer.quant_block_size: must be a power of two >= 64 (got ", b, ")"));
    }
  }
  if (v.Set("optimizer.min_quantized_numel", o.has_min_quantized_numel())) {
    v.AtLeast("optimizer.min_quantized_numel", o.min_quantized_numel(), 0);
  }
  const zerotrain::AdafactorConfig& a = o.adafactor();
  if (v.Set("optimizer.adafactor.decay_rate", a.has_decay_rate())) {
    v.Real("optimizer.adafactor.decay_rate", a.decay_rate(),
           a.decay_rate() >= -1 && a.decay_rate() < 0, "in [-1, 0)");
  }
  if (v.Set("optimizer.adafactor.clip_threshold", a.has_clip_threshold())) {
    v.Positive("optimizer.adafactor.clip_threshold", a.clip_threshold());
  }
  if (v.Set("optimizer.adafactor.eps1", a.has_eps1())) {
    v.Positive("optimizer.adafactor.eps1", a.eps1());
  }
  if (v.Set("optimizer.adafactor.eps2", a.has_eps2())) {
    v.Positive("optimizer.adafactor.eps2", a.eps2());
  }
  v.UnitHalfOpen("optimizer.adafactor.beta1", a.beta1());
  if (a.warmup_init() && !a.relative_step()) {
    v.Add("optimizer.adafactor.warmup_init: requires optimizer.adafactor.relative_step");
  }
  v.Positive("optimizer.lr", o.lr());
  if (v.Set("optimizer.beta1", o.has_beta1())) v.UnitHalfOpen("optimizer.beta1", o.beta1());
  if (v.Set("optimizer.beta2", o.has_beta2())) v.UnitHalfOpen("optimizer.beta2", o.beta2());
  if (v.Set("optimizer.eps", o.has_eps())) v.Positive("optimizer.eps", o.eps());
  if (v.Set("optimizer.weight_decay", o.has_weight_decay())) {
    v.NonNegative("optimizer.weight_decay", o.weight_decay());
  }
  if (v.Set("optimizer.grad_clip", o.has_grad_clip())) {
    v.NonNegative("optimizer.grad_clip", o.grad_clip());
  }
  v.UnitHalfOpen("optimizer.momentum", o.momentum());
  const OptimizerConfig::Schedule& s = o.schedule();
  v.AtLeast("optimizer.schedule.warmup_steps", s.warmup_steps(), 0);
  if (s.decay() != OptimizerConfig::CONSTANT && s.decay() != OptimizerConfig::COSINE &&
      s.decay() != OptimizerConfig::LINEAR) {
    v.Add(absl::StrCat("optimizer.schedule.decay: must be CONSTANT, COSINE or LINEAR (got ",
                       NameOf(s.decay(), OptimizerConfig::Decay_Name<int>), ")"));
  }
  v.Real("optimizer.schedule.min_lr_ratio", s.min_lr_ratio(),
         s.min_lr_ratio() >= 0 && s.min_lr_ratio() <= 1, "in [0, 1]");
}

void ValidateDType(absl::string_view field, PrecisionConfig::DType dtype, Violations& v) {
  if (dtype != PrecisionConfig::FP32 && dtype != PrecisionConfig::BF16 &&
      dtype != PrecisionConfig::FP16) {
    v.Add(absl::StrCat(field, ": must be FP32, BF16 or FP16 (got ",
                       NameOf(dtype, PrecisionConfig::DType_Name<int>), ")"));
  }
}

void ValidateRest(const JobSpec& spec, Violations& v) {
  const PrecisionConfig& pr = spec.precision();
  ValidateDType("precision.param_dtype", pr.param_dtype(), v);
  ValidateDType("precision.compute_dtype", pr.compute_dtype(), v);
  ValidateDType("precision.grad_dtype", pr.grad_dtype(), v);
  ValidateDType("precision.reduce_dtype", pr.reduce_dtype(), v);
  if (v.Set("precision.master_weights", pr.has_master_weights()) && !pr.master_weights() &&
      pr.param_dtype() != PrecisionConfig::FP32 &&
      spec.optimizer().type() != OptimizerConfig::SGD) {
    // Adam-family states and updates need fp32: a 16-bit parameter cannot absorb updates
    // much smaller than itself.
    v.Add(absl::StrCat("precision.master_weights: false with precision.param_dtype ",
                       NameOf(pr.param_dtype(), PrecisionConfig::DType_Name<int>),
                       " is not allowed with optimizer.type ",
                       NameOf(spec.optimizer().type(), OptimizerConfig::Type_Name<int>),
                       ", which needs fp32 master weights"));
  }
  if (pr.has_master_weights() && pr.master_weights() && pr.param_dtype() == PrecisionConfig::FP32) {
    v.Add(
        "precision.master_weights: true needs a 16-bit precision.param_dtype (FP32 parameters "
        "are their own master weights)");
  }
  if (pr.stochastic_rounding() && pr.param_dtype() != PrecisionConfig::BF16) {
    v.Add(absl::StrCat("precision.stochastic_rounding: requires precision.param_dtype BF16 (got ",
                       NameOf(pr.param_dtype(), PrecisionConfig::DType_Name<int>), ")"));
  }
  if (pr.split_master_weights()) {
    if (pr.param_dtype() != PrecisionConfig::BF16) {
      v.Add(
          absl::StrCat("precision.split_master_weights: requires precision.param_dtype BF16 (got ",
                       NameOf(pr.param_dtype(), PrecisionConfig::DType_Name<int>),
                       "): the parameters are the master weights' high 16 bits"));
    }
    if (pr.has_master_weights() && !pr.master_weights()) {
      v.Add("precision.split_master_weights: requires precision.master_weights (it is false)");
    }
    if (pr.stochastic_rounding()) {
      v.Add(
          "precision.split_master_weights: cannot be combined with precision.stochastic_rounding "
          "(the BF16 parameters must be the master rounded to nearest)");
    }
  }
  const zerotrain::LossScaleConfig& ls = pr.loss_scale();
  if (v.Set("precision.loss_scale.initial_power", ls.has_initial_power()) &&
      (ls.initial_power() < 0 || ls.initial_power() > 64)) {
    v.Add(absl::StrCat("precision.loss_scale.initial_power: must be in [0, 64] (got ",
                       ls.initial_power(), ")"));
  }
  if (v.Set("precision.loss_scale.window", ls.has_window())) {
    v.AtLeast("precision.loss_scale.window", ls.window(), 1);
  }
  if (v.Set("precision.loss_scale.hysteresis", ls.has_hysteresis())) {
    v.AtLeast("precision.loss_scale.hysteresis", ls.hysteresis(), 1);
  }
  if (v.Set("precision.loss_scale.min_scale", ls.has_min_scale())) {
    v.Positive("precision.loss_scale.min_scale", ls.min_scale());
  }
  if (ls.has_static_scale()) v.Positive("precision.loss_scale.static_scale", ls.static_scale());
  if (v.Set("precision.loss_scale.max_overflows_at_min_scale",
            ls.has_max_overflows_at_min_scale())) {
    v.AtLeast("precision.loss_scale.max_overflows_at_min_scale", ls.max_overflows_at_min_scale(),
              1);
  }

  const zerotrain::MemoryConfig& mem = spec.memory();
  using Ckpt = zerotrain::MemoryConfig;
  if (mem.activation_checkpointing() != Ckpt::NONE &&
      mem.activation_checkpointing() != Ckpt::FULL &&
      mem.activation_checkpointing() != Ckpt::EVERY_K &&
      mem.activation_checkpointing() != Ckpt::SELECTIVE) {
    v.Add(absl::StrCat(
        "memory.activation_checkpointing: must be NONE, FULL, EVERY_K or SELECTIVE (got ",
        NameOf(mem.activation_checkpointing(), Ckpt::ActivationCheckpointing_Name<int>), ")"));
  }
  if (v.Set("memory.checkpoint_every_k", mem.has_checkpoint_every_k())) {
    v.AtLeast("memory.checkpoint_every_k", mem.checkpoint_every_k(), 1);
  }

  if (v.Set("scheduling.max_restarts", spec.scheduling().has_max_restarts())) {
    v.AtLeast("scheduling.max_restarts", spec.scheduling().max_restarts(), 0);
  }

  const zerotrain::CheckpointConfig& ckpt = spec.checkpoint();
  if (v.Set("checkpoint.interval_steps", ckpt.has_interval_steps())) {
    v.AtLeast("checkpoint.interval_steps", ckpt.interval_steps(), 1);
  }
  if (v.Set("checkpoint.keep_last", ckpt.has_keep_last())) {
    v.AtLeast("checkpoint.keep_last", ckpt.keep_last(), 1);
  }
  v.Set("checkpoint.save_optimizer", ckpt.has_save_optimizer());
  if (ckpt.on_save_error() != zerotrain::CheckpointConfig::FAIL &&
      ckpt.on_save_error() != zerotrain::CheckpointConfig::CONTINUE) {
    v.Add(absl::StrCat(
        "checkpoint.on_save_error: must be FAIL or CONTINUE (got ",
        NameOf(ckpt.on_save_error(), zerotrain::CheckpointConfig::SaveErrorPolicy_Name<int>), ")"));
  }

  const ResourceConfig& r = spec.resources();
  if (r.device() != ResourceConfig::CPU && r.device() != ResourceConfig::CUDA) {
    v.Add(absl::StrCat("resources.device: must be CPU or CUDA (got ",
                       NameOf(r.device(), ResourceConfig::DeviceKind_Name<int>), ")"));
  }
  v.AtLeast("resources.cpu_threads", r.cpu_threads(), 0);
}

enum class PathProblem { kNone, kMissing, kUnreadable, kNotRegular };

// `directory_ok`: the field may name a directory (a Hugging Face model directory) as well as
// a file.
PathProblem CheckPath(absl::string_view field, const std::string& path,
                      std::vector<std::string>& lines, bool directory_ok = false) {
  namespace fs = std::filesystem;
  if (path.empty()) {
    lines.push_back(absl::StrCat(field, ": the path is empty"));
    return PathProblem::kMissing;
  }
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    lines.push_back(absl::StrCat(field, ": '", path, "' does not exist"));
    return PathProblem::kMissing;
  }
  if (ec) {
    lines.push_back(absl::StrCat(field, ": '", path, "' cannot be inspected: ", ec.message()));
    return PathProblem::kUnreadable;
  }
  const bool directory = status.type() == fs::file_type::directory;
  if (status.type() != fs::file_type::regular && !(directory_ok && directory)) {
    lines.push_back(absl::StrCat(field, ": '", path, "' is not a regular file",
                                 directory_ok ? " or a directory" : ""));
    return PathProblem::kNotRegular;
  }
  if (::access(path.c_str(), R_OK) != 0) {
    lines.push_back(absl::StrCat(field, ": '", path, "' is not readable: ", std::strerror(errno)));
    return PathProblem::kUnreadable;
  }
  return PathProblem::kNone;
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec) {
  Violations v;
  ValidateName(spec.name(), v);
  ValidateStrings(spec, "", v);
  ValidateModel(spec, v);
  ValidateData(spec, v);
  ValidateTrain(spec, v);
  ValidateOptimizer(spec, v);
  ValidateRest(spec, v);
  for (std::string& line : ParallelViolations(spec)) v.Add(std::move(line));
  for (std::string& line : OffloadViolations(spec)) v.Add(std::move(line));
  for (std::string& line : LoraViolations(spec)) v.Add(std::move(line));
  if (v.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(v.Join());
}

absl::Status CheckJobPaths(const JobSpec& spec) {
  std::vector<std::string> lines;
  bool missing = false;
  bool unreadable = false;
  auto check = [&](absl::string_view field, const std::string& path, bool directory_ok = false) {
    const PathProblem problem = CheckPath(field, path, lines, directory_ok);
    missing |= problem == PathProblem::kMissing;
    unreadable |= problem == PathProblem::kUnreadable;
  };
  // Each entry on its own, so every bad one is listed, not only the first pattern's.
  auto check_entry = [&](const std::string& field, const std::string& entry) {
    absl::StatusOr<std::vector<std::string>> files = ExpandDataEntry(entry, field);
    if (!files.ok()) {
      lines.emplace_back(files.status().message());
      missing |= files.status().code() == absl::StatusCode::kNotFound;
      unreadable |= files.status().code() == absl::StatusCode::kPermissionDenied;
      return;
    }
    for (const std::string& file : *files) check(field, file);
  };
  for (int i = 0; i < spec.data().train_size(); ++i) {
    check_entry(absl::StrCat("data.train[", i, "]"), spec.data().train(i));
  }
  for (int i = 0; i < spec.data().val_size(); ++i) {
    check_entry(absl::StrCat("data.val[", i, "]"), spec.data().val(i));
  }
  if (!spec.model().init_from().empty()) {
    check("model.init_from", spec.model().init_from(), /*directory_ok=*/true);
  }
  if (!spec.model().lora().init_from().empty()) {
    check("model.lora.init_from", spec.model().lora().init_from(), /*directory_ok=*/true);
  }
  if (const absl::Status nvme = CheckNvmePath(spec); !nvme.ok()) {
    lines.emplace_back(nvme.message());
    missing |= nvme.code() == absl::StatusCode::kNotFound;
    unreadable |= nvme.code() == absl::StatusCode::kPermissionDenied;
  }
  if (lines.empty()) return absl::OkStatus();
  const std::string message = absl::StrJoin(lines, "\n");
  if (missing) return absl::NotFoundError(message);
  if (unreadable) return absl::PermissionDeniedError(message);
  return absl::InvalidArgumentError(message);
}

// Each line below goes when its feature lands.
absl::Status CheckEngineSupport(const JobSpec& spec) {
  std::vector<std::string> lines;
  const auto& precision = spec.precision();
  // The data-parallel reductions convert gradients into reduce_dtype and back
  // (ShardingEngine::ReduceGradients). An fp16 reduction needs the loss scaler (it keeps
  // gradients inside fp16's range and skips the step a sum overflows), which runs only when a
  // dtype of the forward/backward is FP16.
  using P = zerotrain::PrecisionConfig;
  if (spec.parallel().world_size() > 1 && precision.reduce_dtype() == P::FP16 &&
      precision.param_dtype() != P::FP16 && precision.compute_dtype() != P::FP16 &&
      precision.grad_dtype() != P::FP16) {
    lines.push_back(absl::StrCat(
        "precision.reduce_dtype: FP16 needs loss scaling, which runs only when param_dtype, "
        "compute_dtype or grad_dtype is FP16 (grad_dtype is ",
        P::DType_Name(precision.grad_dtype()), "); reduce in BF16 or FP32, or train in FP16"));
  }
  // Validation, zt estimate and the planner accept tensor, pipeline and sequence parallelism
  // (issue 18); the step loop trains tensor parallelism (docs/parallelism.md) on CPU and CUDA
  // ranks, in f32 or 16-bit mixed precision, under every ZeRO stage; pipeline parallelism on CPU
  // ranks, in f32 or 16-bit mixed precision, with the GPIPE, ONE_F_ONE_B and INTERLEAVED
  // schedules at every ZeRO stage (at 3 keeping each stage's units gathered for the step or
  // gathering them per use), each stage's units tensor-parallel when t > 1, its optimizer
  // offloaded (CPU or NVME) or not, at ZeRO 3 its parameter shards too (offload.params, with
  // the rules below); sequence parallelism with any of them.
  const zerotrain::ParallelConfig& parallel = spec.parallel();
  // Pipeline parallelism: nothing is refused here. One micro-batch is a schedule too at every ZeRO
  // stage: at stage 2 (or 3 keeping the units gathered) the stage reduce-scatters its one backward
  // of each unit as it ends, as at 3 with reshard_after_forward it does each micro-batch's
  // (StageGradientsPerMicroBatch; PipelineReshardTest.OneMicroBatchTrainsAgainstOneRank, within
  // the fp32 reduction-order tolerance that test states).
  // CUDA ranks: the stages' sends, statistics and bubble timings cross in device buffers
  // (tests/unit/worker/trainer/pipeline_separate_memory_test.cc; on a GPU,
  // tests/gpu/worker/train/pipeline_gpu_test.cc).
  // model.lora: each stage trains its own blocks' adapters over its frozen base, seeded or
  // from model.init_from (a quantized one streamed into the stage's own units, on the device,
  // in the pinned host pool or the swap store:
  // LoraOffloadTrainingTest.StreamedQuantizedBaseSwappedIsTheDevicePathBitForBit).
  // Adafactor's factored statistics are per tensor and a stage holds its tensors whole (with
  // t > 1, tensor parallelism's summed statistics, refused above for replicated KV heads).
  if (const int tp = parallel.tensor_parallel(); tp > 1) {
    const auto needs = [&](const std::string& what) {
      lines.push_back(absl::StrCat("parallel.tensor_parallel: ", tp, " trains ", what, " so far"));
    };
    // On CUDA the local ops are kernels/cuda/tensor_parallel.h's and the collectives go over
    // the rank's device communicator (NCCL, or staged through the host when ranks share a GPU;
    // tests/gpu/worker/train/tensor_parallel_gpu_test.cc). Adafactor's statistics of a split
    // tensor are summed over the group by the CUDA kernel's tensor-parallel path on device
    // memory (kernels/cuda/adafactor.cu), or by the host step under optimizer offload.
    // Optimizer offload (CPU or NVME) steps each rank's shares like any flat shard; 16-bit
    // precision keeps f32 master weights of each share, as one rank does; Adafactor counts a
    // replicated KV head's rows once in its summed statistics (worker/optim/adafactor_splits.h).
  }
  // Validation, zt estimate and the planner accept every offload; the step loop trains
  // offload.optimizer CPU (ZeRO-Offload) and NVME (ZeRO-Infinity's optimizer offload) on CPU
  // devices; offload.params CPU (the stage-3 shards in the pinned host pool) beside either of
  // them, and offload.params NVME (the shards swapped with the states) beside optimizer NVME —
  // or, for a LoRA job, its frozen base swapped beside any optimizer offload, on pipeline
  // stages and tensor-parallel ranks too (each rank swaps its own share of its own stage's
  // base, a tensor-parallel rank's quantized share included), seeded or streamed from
  // model.init_from (a quantized one staged on the host a unit at a time, the store written
  // whole shard by whole shard).
  using Offload = zerotrain::OffloadConfig;
  const Offload& offload = spec.offload();
  if (offload.params() == Offload::CPU || offload.params() == Offload::NVME) {
    const std::string params = Offload::Device_Name(offload.params());
    const auto needs = [&](const std::string& what) {
      lines.push_back(absl::StrCat("offload.params: ", params, " trains ", what, " so far"));
    };
    if (offload.params() == Offload::CPU && offload.optimizer() != Offload::CPU &&
        offload.optimizer() != Offload::NVME && !UsesLora(spec.model())) {
      // The update then runs where the parameters are: the host (a LoRA job's offloaded
      // shards are its frozen base, which nothing updates).
      needs("with offload.optimizer CPU or NVME (the step updates the host shards in place)");
    }
    if (offload.params() == Offload::NVME && offload.optimizer() != Offload::NVME &&
        !UsesLora(spec.model())) {
      // A LoRA job's swapped shards are its frozen base, written once and only read
      // (worker/offload/swapped_base.h): any optimizer offload trains beside it.
      needs(
          "with offload.optimizer NVME (the shards are swapped with the states, in their "
          "generation)");
    }
  }
  const bool optimizer_offload =
      offload.optimizer() == Offload::CPU || offload.optimizer() == Offload::NVME;
  if (optimizer_offload) {
    const std::string device = Offload::Device_Name(offload.optimizer());
    // A CUDA rank's host step moves its units through the copy engine (docs/memory.md); a
    // sharded Adafactor's statistics, summed inside that step in host memory, go over the host
    // step's own Gloo contexts (worker/shard/host_step_sums.h), since the rank's communicators
    // take device buffers only.
    // NVME: gradients down, parameters up and at least one for a unit's states (the trainer
    // checks the exact count for the model and says it). CPU stages one buffer at most (the
    // parameters up; memory_plan.cc), which offload validation's buffer_count ≥ 1 gives.
    if (offload.optimizer() == Offload::NVME && offload.buffer_count() < 3) {
      lines.push_back(absl::StrCat(
          "offload.buffer_count: ", offload.buffer_count(),
          " — the host optimizer step needs 3 ring buffers or more (gradients down, parameters "
          "up, a unit's states in and out of the swap store; twice the states' to read the next "
          "unit ahead)"));
    }
  }
  // The delayed parameter update (ZeRO-Offload's DPU, docs/memory.md) trains beside
  // offload.optimizer CPU or NVME, ZeRO stages 1-3 (at 3 with offload.params NONE, CPU or NVME),
  // AdamW, 8-bit AdamW and Adafactor (sharded and tensor-parallel too), fp32 and bf16, with
  // tensor and pipeline parallelism and with model.lora (whose adapters' host gradient copies
  // have two banks too, lora_plan.cc):
  // its host step runs on a thread of its own beside the next step's compute, so nothing it
  // does may touch what that compute uses.
  if (offload.delayed_update().enabled()) {
    const auto needs = [&](const std::string& what) {
      lines.push_back(
          absl::StrCat("offload.delayed_update.enabled: true trains ", what, " so far"));
    };
    // offload.params CPU trains: the host step writes "<unit>.params.host", a second bank
    // the gathers never read, and Finish copies it into the shards once the next backward
    // has ended (worker/optim/delayed_host_step.h). NVME too: the host step writes the shards
    // into the swap store's next generation, which Finish commits, while the gathers read the
    // committed one (NvmeOptimizer::StepOnHost).
    using P = zerotrain::PrecisionConfig;
    if (precision.param_dtype() == P::FP16 || precision.compute_dtype() == P::FP16 ||
        precision.grad_dtype() == P::FP16) {
      needs(
          "without FP16 in precision (fp16's dynamic loss scaling must skip an overflowing "
          "step's update, which a delayed update learns of only after the next step has "
          "computed on it; use BF16 or FP32)");
    }
    // Tensor and pipeline parallelism train: a step's collectives (the gradient norm's sums,
    // the tied embedding's, the parameters' all-gather) stay on the compute thread, before the
    // host step is handed over or after it has landed. A sharded or tensor-parallel Adafactor's
    // statistics sums, which run inside the host step, go over Gloo contexts of their own
    // (worker/shard/host_step_sums.h), never among the next step's collectives.
  }
  // LoRA: the step loop trains the adapters at every ZeRO stage on CPU ranks, and on CUDA ranks
  // over an FP32, BF16, FP16 or NF4 base, on pipeline stages and tensor-parallel ranks, with
  // the adapters' states and the base's shards offloaded: the adapters (a stage's, a rank's
  // shares) are initialised on the host and uploaded, an NF4 base is quantized on the host into
  // staging and uploaded (docs/lora.md, "LoRA on CUDA ranks"; lora_separate_memory_test.cc,
  // lora_parallel_separate_memory_test.cc and LoraOffloadTrainingTest.
  // OffloadOnRanksOfTheirOwnMemoryIsThePlainRunBitForBit run each through a device whose memory
  // is its own).
  if (UsesLora(spec.model()) && spec.resources().device() == zerotrain::ResourceConfig::CUDA) {
    if (spec.model().base_dtype() == ModelConfig::INT8) {
      lines.push_back(
          "resources.device: CUDA with model.lora over model.base_dtype INT8 — kernels/"
          "int8_linear.h's layer has no CUDA kernel yet; use NF4 on CUDA, or CPU");
    }
  }
  if (UsesLora(spec.model())) {
    if (const int tp = spec.parallel().tensor_parallel(); tp > 1) {
      // The adapters split as their base weights do (worker/model/lora_tensor_parallel.h).
      const auto needs = [&](const std::string& what) {
        lines.push_back(absl::StrCat("parallel.tensor_parallel: ", tp, " with model.lora trains ",
                                     what, " so far"));
      };
      const ModelConfig& m = spec.model();
      if (m.base_dtype() == ModelConfig::NF4 &&
          (m.d_model() % (kNf4Block * tp) != 0 || m.d_ff() % (kNf4Block * tp) != 0)) {
        // A share matches one rank only if each of its 64-element NF4 blocks is a block of the
        // one-rank weight: column-parallel shares hold whole rows of d_model inputs,
        // row-parallel ones (attn.proj / o_proj, mlp.proj / down_proj) d_model / t and d_ff / t
        // input columns of each row (docs/lora.md, "QLoRA on tensor-parallel ranks").
        needs(absl::StrCat("over an NF4 base only when model.d_model (", m.d_model(),
                           ") and model.d_ff (", m.d_ff(), ") are multiples of ", kNf4Block,
                           " x tensor_parallel = ", kNf4Block * tp,
                           ": each rank's share of a row-parallel weight must hold whole ",
                           kNf4Block, "-element NF4 blocks of the one-rank weight"));
      }
    }
  }
  if (UsesLora(spec.model())) {
    // An unquantized base is stored as the parameters are (precision.param_dtype): a different
    // base_dtype would be ignored, not honoured.
    using P = zerotrain::PrecisionConfig;
    const P::DType param = precision.param_dtype();
    const ModelConfig::BaseDType base = spec.model().base_dtype();
    const bool param_fp32 = param == P::FP32 || param == P::DTYPE_UNSPECIFIED;
    const bool differs = (base == ModelConfig::FP32 && !param_fp32) ||
                         (base == ModelConfig::BF16 && param != P::BF16) ||
                         (base == ModelConfig::FP16 && param != P::FP16);
    if (differs) {
      lines.push_back(absl::StrCat(
          "model.base_dtype: ", ModelConfig::BaseDType_Name(base),
          " differs from precision.param_dtype ", P::DType_Name(param_fp32 ? P::FP32 : param),
          "; this engine stores an unquantized base in param_dtype, so set them equal (or "
          "leave base_dtype unset)"));
    }
  }
  if (lines.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrJoin(lines, "\n"));
}

}  // namespace zt
