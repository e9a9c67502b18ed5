// Tests of fanout::ThreadPool and parallel_for: every index is covered exactly once, in
// contiguous chunks no more numerous than the threads, for many (threads, n, grain); exceptions
// from any chunk reach the caller and leave the pool usable.
#include "fanout/core/thread_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fanout/core/error.h"

namespace fanout {
namespace {

using ::testing::HasSubstr;

struct Chunk {
    int64_t begin, end;
    bool operator<(const Chunk& o) const { return begin < o.begin; }
};

// Runs parallel_for and returns its chunks sorted, checking each index is visited exactly once.
std::vector<Chunk> run_and_check_coverage(ThreadPool& pool, int64_t n, int64_t grain) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max<int64_t>(n, 0)));
    std::mutex mutex;
    std::vector<Chunk> chunks;
    pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        std::lock_guard<std::mutex> lock(mutex);
        chunks.push_back({begin, end});
    });
    for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " of n=" << n << " grain=" << grain;
    std::sort(chunks.begin(), chunks.end());
    return chunks;
}

class ThreadPoolCoverageTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadPoolCoverageTest, EachIndexExactlyOnceInContiguousChunks) {
    const int num_threads = GetParam();
    ThreadPool pool(num_threads);
    ASSERT_EQ(pool.num_threads(), num_threads);
    for (int64_t n : {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 64, 100, 127, 1000, 1023, 4097}) {
        for (int64_t grain : {-1, 0, 1, 2, 3, 4, 7, 16, 64, 1000, 5000}) {
            const std::vector<Chunk> chunks = run_and_check_coverage(pool, n, grain);
            if (n == 0) {
                EXPECT_TRUE(chunks.empty()) << "n=0 must not call fn";
                continue;
            }
            ASSERT_FALSE(chunks.empty());
            EXPECT_LE(static_cast<int>(chunks.size()), num_threads) << "n=" << n << " grain=" << grain;
            // No more chunks than grain allows: ceil(n / grain).
            const int64_t g = std::max<int64_t>(grain, 1);
            EXPECT_LE(static_cast<int64_t>(chunks.size()), (n + g - 1) / g) << "n=" << n << " grain=" << grain;
            EXPECT_EQ(chunks.front().begin, 0);
            EXPECT_EQ(chunks.back().end, n);
            for (size_t i = 0; i < chunks.size(); ++i) {
                EXPECT_LT(chunks[i].begin, chunks[i].end) << "empty chunk, n=" << n << " grain=" << grain;
                if (i > 0) {
                    EXPECT_EQ(chunks[i].begin, chunks[i - 1].end);
                }
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadPoolCoverageTest, ::testing::Values(1, 2, 3, 4, 7, 8),
                         [](const auto& info) { return "t" + std::to_string(info.param); });

// Regression (was a bug): the header promises "chunks of at least `grain` items", but n=5,
// grain=4 on two or more threads gives chunks of 3 and 2 (the chunk count is ceil(n / grain),
// then n is split evenly over it). Enable once parallel_for keeps every chunk but the last at
// `grain` or more, or the header is changed to say what it does.
TEST(ThreadPoolTest, ChunksHoldAtLeastGrainItemsExceptTheLast) {
    ThreadPool pool(4);
    for (int64_t n : {5, 10, 100, 1000}) {
        for (int64_t grain : {3, 4, 16, 64, 300}) {
            const std::vector<Chunk> chunks = run_and_check_coverage(pool, n, grain);
            for (size_t i = 0; i + 1 < chunks.size(); ++i)
                EXPECT_GE(chunks[i].end - chunks[i].begin, grain) << "n=" << n << " grain=" << grain;
        }
    }
}

TEST(ThreadPoolTest, UsesSeveralThreadsWhenThereIsWork) {
    ThreadPool pool(4);
    std::mutex mutex;
    std::vector<std::thread::id> ids;
    pool.parallel_for(4, 1, [&](int64_t, int64_t) {
        std::lock_guard<std::mutex> lock(mutex);
        ids.push_back(std::this_thread::get_id());
    });
    ASSERT_EQ(ids.size(), 4u);
    std::sort(ids.begin(), ids.end());
    EXPECT_EQ(std::unique(ids.begin(), ids.end()) - ids.begin(), 4);
}

TEST(ThreadPoolTest, ManyBackToBackJobs) {
    // Small jobs in quick succession: workers that miss a generation must neither skip nor
    // repeat a chunk of the next one.
    ThreadPool pool(4);
    std::atomic<int64_t> sum{0};
    int64_t expected = 0;
    for (int job = 0; job < 3000; ++job) {
        const int64_t n = 1 + job % 13;
        pool.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) sum.fetch_add(i + 1);
        });
        expected += n * (n + 1) / 2;
    }
    EXPECT_EQ(sum.load(), expected);
}

TEST(ThreadPoolTest, RethrowsExceptionFromWorkerChunk) {
    ThreadPool pool(4);
    try {
        pool.parallel_for(400, 1, [&](int64_t begin, int64_t end) {
            if (begin <= 350 && 350 < end) FANOUT_FAIL("bad index {}", 350);
        });
        FAIL() << "expected fanout::Error";
    } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("bad index 350"));
    }
}

TEST(ThreadPoolTest, RethrowsExceptionFromCallerChunk) {
    ThreadPool pool(4);
    std::atomic<int> chunks_done{0};
    EXPECT_THROW(pool.parallel_for(400, 1,
                                   [&](int64_t begin, int64_t) {
                                       if (begin == 0) throw std::runtime_error("first chunk");
                                       ++chunks_done;
                                   }),
                 std::runtime_error);
    EXPECT_EQ(chunks_done.load(), 3) << "the other chunks still run to completion before the rethrow";
}

TEST(ThreadPoolTest, RethrowsWhenEveryChunkThrowsAndStaysUsable) {
    ThreadPool pool(3);
    for (int round = 0; round < 20; ++round) {
        EXPECT_THROW(pool.parallel_for(90, 1, [](int64_t, int64_t) { throw std::logic_error("all"); }),
                     std::logic_error);
        const std::vector<Chunk> chunks = run_and_check_coverage(pool, 90, 1);
        EXPECT_EQ(chunks.size(), 3u);
    }
}

TEST(ThreadPoolTest, ErrorOfOneJobDoesNotLeakIntoTheNext) {
    ThreadPool pool(4);
    EXPECT_THROW(pool.parallel_for(8, 1,
                                   [](int64_t begin, int64_t) {
                                       if (begin != 0) throw std::runtime_error("worker");
                                   }),
                 std::runtime_error);
    EXPECT_NO_THROW(pool.parallel_for(8, 1, [](int64_t, int64_t) {}));
}

TEST(ThreadPoolTest, SingleThreadRunsInline) {
    ThreadPool pool(1);
    EXPECT_EQ(pool.num_threads(), 1);
    const auto caller = std::this_thread::get_id();
    std::vector<Chunk> chunks;
    pool.parallel_for(100, 1, [&](int64_t begin, int64_t end) {
        EXPECT_EQ(std::this_thread::get_id(), caller);
        chunks.push_back({begin, end});
    });
    ASSERT_EQ(chunks.size(), 1u);
    EXPECT_EQ(chunks[0].begin, 0);
    EXPECT_EQ(chunks[0].end, 100);
}

TEST(ThreadPoolTest, ThreadCountFromEnvironment) {
    const char* old = std::getenv("FANOUT_NUM_THREADS");
    const std::string saved = old ? old : "";
    ::setenv("FANOUT_NUM_THREADS", "3", 1);
    EXPECT_EQ(ThreadPool(0).num_threads(), 3);
    EXPECT_EQ(ThreadPool(2).num_threads(), 2) << "an explicit count wins over the environment";
    ::setenv("FANOUT_NUM_THREADS", "garbage", 1);
    EXPECT_GE(ThreadPool(0).num_threads(), 1);
    if (old)
        ::setenv("FANOUT_NUM_THREADS", saved.c_str(), 1);
    else
        ::unsetenv("FANOUT_NUM_THREADS");
}

TEST(StreamParallelForTest, WithoutPoolRunsInlineOnce) {
    Stream s;
    std::vector<Chunk> chunks;
    parallel_for(s, 10, 1, [&](int64_t begin, int64_t end) { chunks.push_back({begin, end}); });
    ASSERT_EQ(chunks.size(), 1u);
    EXPECT_EQ(chunks[0].begin, 0);
    EXPECT_EQ(chunks[0].end, 10);
    parallel_for(s, 0, 1, [&](int64_t, int64_t) { ADD_FAILURE() << "n=0 must not call fn"; });
    EXPECT_THROW(parallel_for(s, 3, 1, [](int64_t, int64_t) { throw std::runtime_error("x"); }), std::runtime_error);
}

TEST(StreamParallelForTest, WithPoolCoversEveryIndex) {
    ThreadPool pool(4);
    Stream s;
    s.pool = &pool;
    std::vector<std::atomic<int>> hits(1000);
    parallel_for(s, 1000, 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << i;
}

}  // namespace
}  // namespace fanout

namespace fanout {
namespace {

// Threads that cannot all start (here: an address-space limit their stacks pass) are a clear
// error, after the ones started are stopped; before, the constructor's unwinding destroyed the
// mutex and condition variable under running workers and hung for good.
TEST(ThreadPoolTest, ThreadsThatCannotStartAreAClearError) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::alarm(30);  // a hang ends the child, and the test fails
        long pages = 0;
        std::ifstream("/proc/self/statm") >> pages;
        const rlim_t limit = static_cast<rlim_t>(pages) * ::sysconf(_SC_PAGESIZE) + (64 << 20);
        const rlimit r{limit, limit};
        if (::setrlimit(RLIMIT_AS, &r) != 0) ::_exit(3);
        try {
            ThreadPool pool(2000);  // 2,000 stacks of 8 MB: far past the limit
        } catch (const Error& e) {
            ::_exit(std::string(e.what()).find("cannot start 2000 CPU threads") != std::string::npos ? 0 : 1);
        } catch (...) {
            ::_exit(2);
        }
        ::_exit(4);  // they all started: the limit did not bite
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << WTERMSIG(status) << " (14: a hang)";
    EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace fanout
