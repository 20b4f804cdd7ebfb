#include "core/sys_check.h"

#include <cstring>
#include <string>

namespace lowcomm {

Status sys_error(std::string_view call_text, std::string_view what, int err) {
  auto paren = call_text.find('(');
  if (paren != std::string_view::npos) call_text = call_text.substr(0, paren);
  while (!call_text.empty() && (call_text.front() == ':' || call_text.front() == ' '))
    call_text.remove_prefix(1);
  std::string msg(call_text);
  msg += " failed";
  if (!what.empty()) {
    msg += " for ";
    msg += what;
  }
  char buf[128];
  // GNU strerror_r returns the message pointer (possibly a static string, not buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  msg += ": ";
  msg += text;
  msg += " (errno " + std::to_string(err) + ")";
  return Status(StatusCode::kSystem, std::move(msg));
}

}  // namespace lowcomm
