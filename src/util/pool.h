// Free lists for the objects that tracing makes and drops by the dozen every step: a tensor's
// state, a pending node, an autograd node. Each thread keeps, per object size, a list of
// blocks freed on it (up to kMaxBlocks; more go back to the heap), so a step that records the
// same ops as the last one takes its objects from that list instead of the heap. glibc keeps
// only seven blocks per size in its per-thread cache, so a step's worth of these objects, all
// freed at its end, went through its slower bins every step.
//
// A block may be freed on another thread than the one that made it: it joins that thread's
// list. A thread's blocks go back to the heap when it exits. Under AddressSanitizer a block on
// a list is poisoned past its link, so a use after free is still reported.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define LAZYRT_POOL_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define LAZYRT_POOL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define LAZYRT_POOL_POISON(p, n) ((void)(p), (void)(n))
#define LAZYRT_POOL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace lazyrt::util {

template <size_t Size, size_t Align>
class BlockPool {
 public:
  static constexpr size_t kMaxBlocks = 4096;

  static void* get() {
    List& l = list();
    if (l.head) {
      Free* f = l.head;
      LAZYRT_POOL_UNPOISON(f, Size);
      l.head = f->next;
      --l.count;
      return f;
    }
    return ::operator new(Size, std::align_val_t(Align));
  }
  static void put(void* p) noexcept {
    List& l = list();
    if (l.closed || l.count >= kMaxBlocks) {
      ::operator delete(p, std::align_val_t(Align));
      return;
    }
    auto* f = static_cast<Free*>(p);
    f->next = l.head;
    LAZYRT_POOL_POISON(static_cast<char*>(p) + sizeof(Free), Size - sizeof(Free));
    l.head = f;
    ++l.count;
  }

 private:
  struct Free {
    Free* next;
  };
  static_assert(Size >= sizeof(Free));
  // Trivial, so reaching it is one look-up of the thread's storage (an object with a
  // destructor takes a second one, for its guard, on every use). The blocks go back to the
  // heap through Closer, armed by the thread's first get.
  struct List {
    Free* head;
    size_t count;
    bool closed;  // the thread is exiting: blocks freed from now on go to the heap
    bool armed;
  };
  struct Closer {
    List* l;
    ~Closer() {
      l->closed = true;
      while (l->head) {
        Free* f = l->head;
        l->head = f->next;
        LAZYRT_POOL_UNPOISON(f, Size);
        ::operator delete(f, std::align_val_t(Align));
      }
      l->count = 0;
    }
  };
  static List& list() {
    thread_local constinit List l{nullptr, 0, false, false};
    if (!l.armed) [[unlikely]] {
      l.armed = true;
      thread_local Closer closer{&l};
      (void)closer;
    }
    return l;
  }
};

/// A T of the calling thread, reached through a plain thread-local pointer: one look-up of the
/// thread's storage per use, where a thread-local object with a destructor costs a second one,
/// for its guard, every time. Made by the thread's first get(); destroyed when the thread
/// exits, after which alive() is null. Tag tells apart uses of one T.
template <class T, class Tag>
class PerThread {
 public:
  static T& get() {
    T* p = ptr();
    if (!p) [[unlikely]] p = make();
    return *p;
  }
  static T* alive() { return ptr(); }

 private:
  static T*& ptr() {
    thread_local constinit T* p = nullptr;
    return p;
  }
  static T* make() {
    struct Owner {
      T value;
      ~Owner() { ptr() = nullptr; }
    };
    thread_local Owner owner;
    ptr() = &owner.value;
    return &owner.value;
  }
};

/// Emptied vectors of type V kept per thread with their capacity (up to kMax), for the vectors
/// every recorded op makes and every dropped node frees: its operands, its result types, a
/// tensor's shape. take() gives one back (empty, with the capacity it had) or a new one;
/// give() clears a vector (its elements are destroyed there) and keeps it. glibc's allocator
/// serves the same sizes from a per-thread cache of seven blocks per size only.
template <class V>
class VectorStash {
 public:
  static constexpr size_t kMax = 4096;

  static V take() {
    std::vector<V>& s = Stash::get();
    if (s.empty()) return V();
    V v = std::move(s.back());
    s.pop_back();
    return v;
  }
  static void give(V&& v) noexcept {
    if (v.capacity() == 0) return;
    v.clear();  // may drop more nodes, which give theirs first
    std::vector<V>* s = Stash::alive();  // none on a thread that never took, or is exiting
    if (!s || s->size() >= kMax) return;
    try {
      s->push_back(std::move(v));
    } catch (...) {  // no room for the stash itself: the vector is freed instead
    }
  }

 private:
  using Stash = PerThread<std::vector<V>, VectorStash>;
};

/// Graphs whose nodes own the nodes they read through shared_ptr (traced ops, autograd nodes)
/// are destroyed one node at a time, not by recursion: an unrolled host loop makes chains of
/// hundreds of thousands of nodes, and dropping one recursively overflows the stack. A node's
/// destructor opens a Scope and defers the pointers it owns to it (each is left empty); the
/// outermost Scope on the thread drops the deferred pointers in a loop when it closes, and each
/// node that dies then opens its own, inner, Scope, which only adds to the list. On a thread
/// that is exiting (its list already destroyed) the pointers are dropped as before.
template <class Node>
class DeferredDrop {
  struct List {
    std::vector<std::shared_ptr<Node>> nodes;
    bool draining = false;
  };
  using PerThreadList = PerThread<List, DeferredDrop>;

  static List* list() noexcept {
    if (List* l = PerThreadList::alive()) return l;
    thread_local constinit bool made = false;
    if (made) return nullptr;  // destroyed: the thread is exiting
    made = true;
    try {
      return &PerThreadList::get();
    } catch (...) {
      return nullptr;
    }
  }

 public:
  class Scope {
   public:
    Scope() noexcept : list_(list()), outer_(list_ && !list_->draining) {
      if (outer_) list_->draining = true;
    }
    ~Scope() {
      if (!outer_) return;
      while (!list_->nodes.empty()) {
        std::shared_ptr<Node> n = std::move(list_->nodes.back());
        list_->nodes.pop_back();
        n.reset();  // where it was the last owner, its destructor defers what it owns
      }
      list_->draining = false;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

    void defer(std::shared_ptr<Node>& p) noexcept {
      if (!list_ || !p) return;
      try {
        list_->nodes.push_back(std::move(p));
      } catch (...) {  // no room: p is dropped where it is
      }
    }

   private:
    List* list_;
    bool outer_;
  };
};

/// An allocator over BlockPool for single objects (what allocate_shared asks for).
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n == 1) return static_cast<T*>(BlockPool<sizeof(T), alignof(T)>::get());
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n == 1) BlockPool<sizeof(T), alignof(T)>::put(p);
    else std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept {
    return true;
  }
};

/// std::make_shared, the object and its count in one pooled block.
template <class T, class... Args>
std::shared_ptr<T> make_pooled(Args&&... args) {
  return std::allocate_shared<T>(PoolAllocator<T>(), std::forward<Args>(args)...);
}

}  // namespace lazyrt::util
