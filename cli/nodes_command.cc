// `zt nodes`: the nodes the coordinator knows, with their devices and health.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/output_format.h"
#include "cli/remote_client.h"
#include "cli/remote_format.h"
#include "worker/status_macros.h"

namespace zt::cli {

absl::Status RunNodes(const RemoteFlags& flags) {
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags));
  zerotrain::ListNodesResponse response;
  ZT_RETURN_IF_ERROR(client.CallIdempotent("ListNodes", [&](grpc::ClientContext* context) {
    return client.jobs->ListNodes(context, zerotrain::ListNodesRequest(), &response);
  }));
  if (!flags.json) {
    std::cout << FormatNodeTable(response.nodes(), NowMs());
    return absl::OkStatus();
  }
  std::vector<std::string> objects;
  for (const zerotrain::Node& node : response.nodes()) {
    ZT_ASSIGN_OR_RETURN(std::string text, ToJson(node));
    objects.push_back(std::move(text));
  }
  std::cout << "[" << absl::StrJoin(objects, ",\n") << "]\n";
  return absl::OkStatus();
}

}  // namespace zt::cli
