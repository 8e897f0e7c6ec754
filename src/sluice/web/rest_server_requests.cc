// RestServer::Impl's request helpers: job and vertex lookup (404), JSON bodies and fields (400), request ids,
// savepoint operations and bodies read only when announced.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "rest_server_internals.h"

namespace sluice {

std::shared_ptr<JobEntry> RestServer::Impl::find_job(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

std::shared_ptr<JobEntry> RestServer::Impl::job_or_404(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  auto job = find_job(id);
  if (!job) {
    reply_error(res, 404,
                fmt::format("no job with id '{}' on this JobManager (GET /jobs or `sluice list` shows its jobs)", id));
  }
  return job;
}

std::optional<Value> RestServer::Impl::body_or_400(const std::string& body, httplib::Response& res) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) return Value::object();
  auto v = Value::from_json(body);
  if (!v.ok()) {
    reply_error(res, 400, fmt::format("the request body is not valid JSON: {}", v.error().message()));
    return std::nullopt;
  }
  if (!v->is_object()) {
    reply_error(res, 400, "the request body must be a JSON object");
    return std::nullopt;
  }
  return std::move(*v);
}

bool RestServer::Impl::string_field(const Value& body, std::string_view key, std::string& out, httplib::Response& res) {
  const Value* v = body.find(key);
  if (v == nullptr || v->is_null()) return true;
  if (!v->is_string()) {
    reply_error(res, 400, fmt::format("\"{}\" must be a string (a directory)", key));
    return false;
  }
  out = std::string(v->as_string());
  return true;
}

bool RestServer::Impl::bool_field(const Value& body, std::string_view key, bool& out, httplib::Response& res) {
  const Value* v = body.find(key);
  if (v == nullptr || v->is_null()) return true;
  if (!v->is_bool()) {
    reply_error(res, 400, fmt::format("\"{}\" must be true or false", key));
    return false;
  }
  out = v->as_bool();
  return true;
}

std::string RestServer::Impl::new_request_id() {
  const uint64_t n = request_counter_.fetch_add(1) + 1;
  const uint64_t a = splitmix(id_seed_ ^ n);
  return fmt::format("{:016x}{:016x}", a, splitmix(a));
}

uint64_t RestServer::Impl::splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

bool RestServer::Impl::running_or_409(JobEntry& job, const char* action, httplib::Response& res) {
  const JobStatus s = job.client.status();
  if (s == JobStatus::kRunning) return true;
  reply_error(res, 409,
              fmt::format("cannot {} job '{}' ({}): it is {}, not RUNNING", action, job.name, job.client.job_id(),
                          job_status_name(s)));
  return false;
}

void RestServer::Impl::add_operation(JobEntry& job, const std::string& rid, std::shared_future<Result<std::string>> f) {
  std::lock_guard lock(mu_);
  job.operations[rid] = Operation{std::move(f), false};
}

std::optional<RestServer::Impl::SavepointRequest> RestServer::Impl::savepoint_request(const httplib::Request& req,
                                                                                      const std::string& text,
                                                                                      httplib::Response& res,
                                                                                      std::string_view target_key,
                                                                                      std::string_view flag_key) {
  SavepointRequest r;
  r.job = job_or_404(req, res);
  if (!r.job) return std::nullopt;
  auto body = body_or_400(text, res);
  if (!body) return std::nullopt;
  if (!string_field(*body, target_key, r.target, res) || !bool_field(*body, flag_key, r.flag, res)) return std::nullopt;
  return r;
}

void RestServer::Impl::accept_savepoint_operation(JobEntry& job, std::shared_future<Result<std::string>> f,
                                                  std::string_view what, const std::string& target,
                                                  httplib::Response& res) {
  const std::string rid = new_request_id();
  add_operation(job, rid, std::move(f));
  spdlog::info("REST: {} {} of job {} requested into {}", what, rid, job.client.job_id(),
               target.empty() ? std::string("the default savepoint directory") : "'" + target + "'");
  reply(res, 202, Value::object({{"request-id", rid}}));
}

httplib::Server::HandlerWithContentReader RestServer::Impl::with_body(BodyHandler handler) {
  return [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& reader) {
    std::string body;
    if (req.has_header("Content-Length") || req.get_header_value("Transfer-Encoding") == "chunked") {
      bool too_large = false;
      reader([&](const char* data, size_t n) {
        if (body.size() + n > kMaxBody) {
          too_large = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (too_large) {
        reply_error(res, 413, fmt::format("the request body is larger than {} bytes", kMaxBody));
        return;
      }
    }
    handler(req, body, res);
  };
}

std::vector<std::shared_ptr<JobEntry>> RestServer::Impl::jobs_in_order() {
  std::vector<std::shared_ptr<JobEntry>> jobs;
  std::lock_guard lock(mu_);
  for (const auto& id : order_)
    jobs.push_back(jobs_.at(id));
  return jobs;
}

const JobPlanVertex* RestServer::Impl::vertex_or_404(const std::vector<JobPlanVertex>& vertices,
                                                     const httplib::Request& req, httplib::Response& res) {
  const std::string vid = req.matches[2];
  const JobPlanVertex* v = web::find_vertex(vertices, vid);
  if (v == nullptr) {
    std::string known;
    for (const auto& x : vertices)
      known += (known.empty() ? "" : ", ") + x.id + " (" + x.name + ")";
    reply_error(res, 404,
                fmt::format("no vertex '{}' in this job; its vertices: {}", vid, known.empty() ? "none yet" : known));
  }
  return v;
}

std::optional<std::string> RestServer::Impl::get_param(const httplib::Request& req) {
  if (!req.has_param("get")) return std::nullopt;
  return req.get_param_value("get");
}

Result<std::string> RestServer::Impl::await(const std::shared_future<Result<std::string>>& f) {
  try {
    return f.get();
  } catch (const std::future_error&) {
    return Error(ErrorCode::kCheckpoint, "the job ended before the savepoint completed");
  }
}

}  // namespace sluice
