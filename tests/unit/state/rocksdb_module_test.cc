// The RocksDB state backend's module (state/rocksdb/rocksdb_module.h): loaded by the first database a process
// opens, never before, and a clear error naming every place tried when it cannot be loaded. Each case runs in a
// child process of its own (death-test style "threadsafe": the binary re-executed), since a process loads the
// module once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "sluice/core/error.h"
#include "sluice/state/rocksdb_instance.h"

namespace sluice {
namespace {

std::string maps_of_self() {
  std::ifstream in("/proc/self/maps");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::filesystem::path fresh_dir(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("sluice-rocksdb-module-" + name + "-" + std::to_string(::getpid()));
}

// In the child: prints why and exits 1 unless `condition`.
void require(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "FAILED: %s\n", what);
  std::_Exit(1);
}

class RocksDBModuleTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(RocksDBModuleTest, ProcessMapsRocksDBOnlyOnceItOpensADatabase) {
  EXPECT_EXIT(
      {
        // The test binary links the state backend (sluice_state_rocksdb) as every job binary does, not RocksDB.
        require(maps_of_self().find("librocksdb") == std::string::npos, "librocksdb mapped before any database");
        require(maps_of_self().find("libsluice_rocksdb") == std::string::npos, "the module mapped before use");
        auto db = RocksDBInstance::open(fresh_dir("load"));
        RocksDBInstance::ColumnFamily* cf = db->column_family("s");
        db->put(cf, "k", "v");
        std::string value;
        require(db->get(cf, "k", value) && value == "v", "the value written is not read back");
        const std::string maps = maps_of_self();
        require(maps.find("libsluice_rocksdb.so") != std::string::npos, "the module is not mapped after open()");
        require(maps.find("librocksdb") != std::string::npos, "librocksdb is not mapped after open()");
        db.reset();  // removes its directory (_Exit runs no destructor)
        std::fprintf(stderr, "loaded\n");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "loaded");
}

TEST_F(RocksDBModuleTest, AnErrorOfTheModuleReachesTheCallerAsSluiceException) {
  // Thrown inside the module (its own hidden copy of SluiceException), caught here by type and code.
  RocksDBMemoryOptions bad;
  bad.write_buffer_ratio = 2;
  try {
    RocksDBInstance::open(fresh_dir("bad"), bad);
    FAIL() << "open() accepted a write-buffer ratio of 2";
  } catch (const SluiceException& e) {
    EXPECT_EQ(e.error().code(), ErrorCode::kConfiguration);
    EXPECT_NE(e.error().message().find("write-buffer-ratio"), std::string::npos) << e.error().message();
  }
}

// Opens a database in a child with SLUICE_ROCKSDB_MODULE=`module`; the child prints the error and exits 3.
void expect_load_failure(const std::string& module, const std::string& message_regex) {
  EXPECT_EXIT(
      {
        ::setenv("SLUICE_ROCKSDB_MODULE", module.c_str(), 1);
        try {
          RocksDBInstance::open(fresh_dir("missing"));
        } catch (const SluiceException& e) {
          std::fprintf(stderr, "code %d: %s\n", static_cast<int>(e.error().code()), e.error().message().c_str());
          std::_Exit(3);
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(3), message_regex);
}

TEST_F(RocksDBModuleTest, AMissingModuleFailsNamingWhereItWasLookedFor) {
  const std::string code = std::to_string(static_cast<int>(ErrorCode::kConfiguration));
  expect_load_failure("/nonexistent/libsluice_rocksdb.so",
                      "code " + code +
                          ": state.backend.type 'rocksdb' needs Sluice's RocksDB module libsluice_rocksdb.so, which "
                          "could not be loaded; tried: /nonexistent/libsluice_rocksdb.so \\(no such file\\)");
}

TEST_F(RocksDBModuleTest, AFileThatIsNotTheModuleIsRefusedWithTheLoadersReason) {
  // The same path in the re-executed child (which runs this body again) as here, so no pid in it; one per build
  // tree, so that two presets' runs do not share it.
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::filesystem::path file =
      std::filesystem::path(::testing::TempDir()) /
      ("sluice-not-a-rocksdb-module-" + std::to_string(std::hash<std::string>{}(exe)) + ".so");
  {
    std::ofstream out(file);
    out << "not a shared object\n";
  }
  expect_load_failure(file.string(), "could not be loaded; tried: " + file.string() + " \\(.*(ELF|too short).*\\)");
  std::filesystem::remove(file);
}

// The fake's open() prints "FAKE MODULE CALLED" and aborts: were the token not compared, the child would die that
// way instead of exiting 3 with the refusal.
TEST_F(RocksDBModuleTest, AModuleOfAnotherBuildIsRefusedBeforeAnythingInItIsCalled) {
  expect_load_failure(FAKE_ROCKSDB_MODULE,
                      "could not be loaded; tried: .*fake_rocksdb_module.so \\(built from another "
                      "RocksDBInstance interface or compiler \\(0123456789abcdef against .*a "
                      "module of another build\\)");
}

}  // namespace
}  // namespace sluice
