// hip-emu host shim: the basics of HIP's cooperative groups (hip/hip_cooperative_groups.h):
// this_thread_block(), tiled_partition (static: thread_block_tile<N>; dynamic: thread_group of
// a tile size), coalesced_threads(), a group's thread_rank/size/sync and a tile's shuffles and
// votes. Tiles divide a wave (N a power of two <= 64); a tile's sync is a wave barrier (every
// lane of the wave arrives, as HIP's tiles of one wave do). this_grid() and its sync() work
// under hipLaunchCooperativeKernel, where hip-emu keeps every block of the grid alive at once;
// a grid sync in an ordinary launch is a launch error naming it.
#pragma once

#include <hip/hip_runtime.h>

namespace cooperative_groups {

class thread_block {
 public:
  unsigned thread_rank() const { return hipemu::linear_tid(); }
  unsigned size() const { return blockDim.x * blockDim.y * blockDim.z; }
  unsigned num_threads() const { return size(); }
  dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
  dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
  void sync(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) const {
    hipemu_barrier(file, line);
  }
};

inline thread_block this_thread_block() { return thread_block(); }

/// A tile of `size` lanes (a power of two dividing 64) of one wave.
class thread_group {
 public:
  explicit thread_group(unsigned size) : size_(size) {}
  unsigned thread_rank() const { return static_cast<unsigned>(hipemu::lane_id()) % size_; }
  unsigned size() const { return size_; }
  unsigned num_threads() const { return size_; }
  unsigned meta_group_rank() const { return hipemu::linear_tid() / size_; }
  void sync(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) const {
    hipemu_wave_barrier(file, line);
  }
  template <typename T>
  T shfl(T v, int src, const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) const {
    return __shfl(v, src, static_cast<int>(size_), file, line);
  }
  template <typename T>
  T shfl_down(T v, unsigned d, const char* file = __builtin_FILE(),
              unsigned line = __builtin_LINE()) const {
    return __shfl_down(v, d, static_cast<int>(size_), file, line);
  }
  template <typename T>
  T shfl_up(T v, unsigned d, const char* file = __builtin_FILE(),
            unsigned line = __builtin_LINE()) const {
    return __shfl_up(v, d, static_cast<int>(size_), file, line);
  }
  template <typename T>
  T shfl_xor(T v, int mask, const char* file = __builtin_FILE(),
             unsigned line = __builtin_LINE()) const {
    return __shfl_xor(v, mask, static_cast<int>(size_), file, line);
  }
  /// The predicates of this tile's lanes, bit i for tile lane i.
  unsigned long long ballot(int pred, const char* file = __builtin_FILE(),
                            unsigned line = __builtin_LINE()) const {
    const unsigned long long wave = __ballot(pred, file, line);
    const unsigned first = static_cast<unsigned>(hipemu::lane_id()) / size_ * size_;
    const unsigned long long mask = size_ >= 64 ? ~0ull : ((1ull << size_) - 1);
    return (wave >> first) & mask;
  }
  int any(int pred, const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) const {
    return ballot(pred, file, line) != 0;
  }
  int all(int pred, const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) const {
    const unsigned long long mask = size_ >= 64 ? ~0ull : ((1ull << size_) - 1);
    return ballot(pred, file, line) == mask;
  }

 private:
  unsigned size_;
};

template <unsigned N> class thread_block_tile : public thread_group {
  static_assert(N > 0 && N <= 64 && (N & (N - 1)) == 0, "a tile is a power of two <= 64 lanes");

 public:
  thread_block_tile() : thread_group(N) {}
};

/// The threads of a wave that call it together: every lane of the wave here (hip-emu's lanes
/// are never inactive at a wave operation), so a group of the wave's size.
class coalesced_group : public thread_group {
 public:
  coalesced_group() : thread_group(static_cast<unsigned>(__popcll(hipemu::wave_exist_mask()))) {}
};

inline coalesced_group coalesced_threads() { return coalesced_group(); }

inline thread_group tiled_partition(const thread_block&, unsigned size) {
  return thread_group(size);
}
template <unsigned N> inline thread_block_tile<N> tiled_partition(const thread_block&) {
  return thread_block_tile<N>();
}
/// The whole grid of a cooperative launch.
class grid_group {
 public:
  unsigned long long size() const {
    return static_cast<unsigned long long>(gridDim.x) * gridDim.y * gridDim.z *
           (blockDim.x * blockDim.y * blockDim.z);
  }
  unsigned long long num_threads() const { return size(); }
  unsigned long long thread_rank() const {
    const unsigned long long block =
        (static_cast<unsigned long long>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x +
        blockIdx.x;
    return block * (blockDim.x * blockDim.y * blockDim.z) + hipemu::linear_tid();
  }
  bool is_valid() const { return true; }
  dim3 group_dim() const { return dim3(gridDim.x, gridDim.y, gridDim.z); }
  void sync(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) const {
    hipemu_wave_op(HIPEMU_GRID_SYNC, 0, 0, 0, file, line);
  }
};

inline grid_group this_grid() { return grid_group(); }

template <typename G> inline void sync(const G& g) { g.sync(); }

}  // namespace cooperative_groups
