# Which library components are built, and the packages they need.
#
# Each component (a folder src/<name>) has an option DISTLOCK_WITH_<NAME>, ON by default.
# An enabled component whose dependency is missing fails configuration with a message that
# names the Debian package (and the option that turns the component off); nothing is
# skipped silently. -DDISTLOCK_COMPONENTS="file;redis" is a shorthand that sets the options:
# the listed components ON, the others OFF.
#
# Sets DISTLOCK_COMPONENTS (the enabled components, a plain variable the rest of the build
# reads) and the imported targets the components link: PkgConfig::HIREDIS, OpenSSL::Crypto,
# PkgConfig::GRPCPP (+ DISTLOCK_PROTOC, DISTLOCK_GRPC_CPP_PLUGIN), ZOOKEEPER_INCLUDE_DIR +
# ZOOKEEPER_MT_LIBRARY, PkgConfig::LIBPQ, PkgConfig::LIBMARIADB.

set(DISTLOCK_ALL_COMPONENTS file redis rediscluster redlock etcd zk postgres mysql fencing ids)
set(distlock_component_doc_file "the host-local file:// backend (OpenSSL for name hashing)")
set(distlock_component_doc_redis "the redis:// and redis+sentinel:// backends (hiredis)")
set(distlock_component_doc_rediscluster "the redis+cluster:// backend (needs redis)")
set(distlock_component_doc_redlock "the redlock:// and redlocks:// backends (needs redis)")
set(distlock_component_doc_etcd "the etcd:// backend (gRPC, protobuf, etcd's .proto files)")
set(distlock_component_doc_zk "the zk:// backend (the ZooKeeper C client)")
set(distlock_component_doc_postgres "the postgres:// backend (libpq)")
set(distlock_component_doc_mysql "the mysql:// backend for MariaDB and MySQL (libmariadb)")
set(distlock_component_doc_fencing "fenced writes (FencedFile, FencedRedis; needs redis)")
set(distlock_component_doc_ids "unique ids (snowflake, redis-daily, UUIDv7; needs redis)")

foreach(c IN LISTS DISTLOCK_ALL_COMPONENTS)
  string(TOUPPER ${c} upper)
  option(DISTLOCK_WITH_${upper} "Build ${distlock_component_doc_${c}}" ON)
endforeach()

if(DEFINED CACHE{DISTLOCK_COMPONENTS})
  foreach(c IN LISTS DISTLOCK_COMPONENTS)
    if(NOT c IN_LIST DISTLOCK_ALL_COMPONENTS)
      message(FATAL_ERROR "DISTLOCK_COMPONENTS: unknown component '${c}' "
                          "(known: ${DISTLOCK_ALL_COMPONENTS})")
    endif()
  endforeach()
  foreach(c IN LISTS DISTLOCK_ALL_COMPONENTS)
    string(TOUPPER ${c} upper)
    if(c IN_LIST DISTLOCK_COMPONENTS)
      set(DISTLOCK_WITH_${upper} ON CACHE BOOL "Build ${distlock_component_doc_${c}}" FORCE)
    else()
      set(DISTLOCK_WITH_${upper} OFF CACHE BOOL "Build ${distlock_component_doc_${c}}" FORCE)
    endif()
  endforeach()
  unset(DISTLOCK_COMPONENTS CACHE)
endif()

set(DISTLOCK_COMPONENTS "")
foreach(c IN LISTS DISTLOCK_ALL_COMPONENTS)
  string(TOUPPER ${c} upper)
  if(DISTLOCK_WITH_${upper})
    list(APPEND DISTLOCK_COMPONENTS ${c})
  endif()
endforeach()

# distlock/config.hpp: DISTLOCK_HAS_<NAME> 1 or 0 for each component.
foreach(c IN LISTS DISTLOCK_ALL_COMPONENTS)
  string(TOUPPER ${c} upper)
  if(DISTLOCK_WITH_${upper})
    set(DISTLOCK_HAS_${upper} 1)
  else()
    set(DISTLOCK_HAS_${upper} 0)
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/config.hpp.in ${PROJECT_BINARY_DIR}/include/distlock/config.hpp @ONLY)

foreach(c IN ITEMS rediscluster redlock fencing ids)
  string(TOUPPER ${c} upper)
  if(DISTLOCK_WITH_${upper} AND NOT DISTLOCK_WITH_REDIS)
    message(FATAL_ERROR "DISTLOCK_WITH_${upper}=ON needs DISTLOCK_WITH_REDIS=ON (it uses the redis "
                        "component's connections); turn redis on or -DDISTLOCK_WITH_${upper}=OFF")
  endif()
endforeach()

# A missing dependency of an enabled component: name it, its Debian package, and the way out.
function(distlock_missing component what packages)
  string(TOUPPER ${component} upper)
  message(FATAL_ERROR "DISTLOCK_WITH_${upper}=ON needs ${what}, which was not found. Install the "
                      "Debian package(s) ${packages} (./scripts/bootstrap.sh installs all of them), "
                      "or configure with -DDISTLOCK_WITH_${upper}=OFF.")
endfunction()

# hiredis: the redis family, and the raw-hiredis benchmark baseline.
pkg_check_modules(HIREDIS QUIET IMPORTED_TARGET hiredis)
foreach(c IN ITEMS redis rediscluster redlock fencing ids)
  if(c IN_LIST DISTLOCK_COMPONENTS AND NOT HIREDIS_FOUND)
    distlock_missing(${c} "hiredis (pkg-config hiredis)" libhiredis-dev)
  endif()
endforeach()

if("file" IN_LIST DISTLOCK_COMPONENTS)
  find_package(OpenSSL QUIET)
  if(NOT TARGET OpenSSL::Crypto)
    distlock_missing(file "OpenSSL's libcrypto" libssl-dev)
  endif()
endif()
# OpenSSL's libssl: TLS for rediss:// (the redis family's sockets).
foreach(c IN ITEMS redis rediscluster redlock fencing ids)
  if(c IN_LIST DISTLOCK_COMPONENTS)
    find_package(OpenSSL QUIET)
    if(NOT TARGET OpenSSL::SSL)
      distlock_missing(${c} "OpenSSL's libssl" libssl-dev)
    endif()
  endif()
endforeach()

if("etcd" IN_LIST DISTLOCK_COMPONENTS)
  pkg_check_modules(GRPCPP QUIET IMPORTED_TARGET grpc++ protobuf)
  if(NOT GRPCPP_FOUND)
    distlock_missing(etcd "gRPC and protobuf (pkg-config grpc++ protobuf)" "libgrpc++-dev libprotobuf-dev")
  endif()
  find_program(DISTLOCK_PROTOC protoc)
  if(NOT DISTLOCK_PROTOC)
    distlock_missing(etcd "the protobuf compiler (protoc)" protobuf-compiler)
  endif()
  find_program(DISTLOCK_GRPC_CPP_PLUGIN grpc_cpp_plugin)
  if(NOT DISTLOCK_GRPC_CPP_PLUGIN)
    distlock_missing(etcd "gRPC's C++ protoc plugin (grpc_cpp_plugin)" protobuf-compiler-grpc)
  endif()
  set(DISTLOCK_ETCD_PROTO_ROOT "/usr/share/gocode/src/go.etcd.io/etcd" CACHE PATH
      "Directory holding etcd's etcdserver/, mvcc/ and auth/ .proto files (golang-etcd-server-dev)")
  if(NOT EXISTS ${DISTLOCK_ETCD_PROTO_ROOT}/etcdserver/etcdserverpb/rpc.proto)
    distlock_missing(etcd "etcd's .proto files under DISTLOCK_ETCD_PROTO_ROOT (${DISTLOCK_ETCD_PROTO_ROOT})"
                     golang-etcd-server-dev)
  endif()
endif()

if("zk" IN_LIST DISTLOCK_COMPONENTS)
  find_path(ZOOKEEPER_INCLUDE_DIR zookeeper/zookeeper.h)
  find_library(ZOOKEEPER_MT_LIBRARY NAMES zookeeper_mt)
  if(NOT ZOOKEEPER_INCLUDE_DIR OR NOT ZOOKEEPER_MT_LIBRARY)
    distlock_missing(zk "the ZooKeeper C client (zookeeper/zookeeper.h, libzookeeper_mt)" libzookeeper-mt-dev)
  endif()
endif()

if("postgres" IN_LIST DISTLOCK_COMPONENTS)
  pkg_check_modules(LIBPQ QUIET IMPORTED_TARGET libpq)
  if(NOT LIBPQ_FOUND)
    distlock_missing(postgres "libpq (pkg-config libpq)" libpq-dev)
  endif()
endif()

if("mysql" IN_LIST DISTLOCK_COMPONENTS)
  pkg_check_modules(LIBMARIADB QUIET IMPORTED_TARGET libmariadb)
  if(NOT LIBMARIADB_FOUND)
    distlock_missing(mysql "the MariaDB client library (pkg-config libmariadb)" libmariadb-dev)
  endif()
endif()
