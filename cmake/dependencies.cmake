# Every dependency comes from Debian's packages (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED)
find_package(Protobuf REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(Gloo CONFIG REQUIRED)
find_package(dnnl CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)

# OpenBLAS ships variables only; wrap them in a target.
find_package(OpenBLAS CONFIG REQUIRED)
add_library(zt_openblas INTERFACE)
target_include_directories(zt_openblas INTERFACE ${OpenBLAS_INCLUDE_DIRS})
target_link_libraries(zt_openblas INTERFACE ${OpenBLAS_LIBRARIES})

# The control plane: gRPC services, the coordinator's RocksDB state, Prometheus metrics.
find_package(gRPC CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
# RocksDB's package adds its own Find modules to CMAKE_MODULE_PATH: it comes last.
find_package(RocksDB CONFIG REQUIRED)
