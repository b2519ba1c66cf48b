// ForwardOrder: what prefetching knows of the graph. Backward prefetches the unit that ran before
// in this forward; forward prefetch the one that followed in the previous forward.

#include "runtime/strategy/forward_order.h"

#include <catch2/catch.hpp>

using cxxlaunch::runtime::ForwardOrder;

TEST_CASE("ForwardOrder answers from this forward and from the previous one", "[forward_order]") {
  ForwardOrder order;
  for (size_t unit : {2, 0, 1}) order.record(unit);
  CHECK(order.beforeInThisForward(1) == 0);
  CHECK(order.beforeInThisForward(0) == 2);
  CHECK(order.beforeInThisForward(2) == ForwardOrder::kNone);     // the first: nothing before it
  CHECK(order.beforeInThisForward(7) == ForwardOrder::kNone);     // never ran
  CHECK(order.afterInPreviousForward(2) == ForwardOrder::kNone);  // no previous forward yet

  // A unit that runs later in the same forward (no backward ended since) extends the order.
  order.record(3);
  CHECK(order.beforeInThisForward(3) == 1);
  order.backwardEnded();

  order.record(1);  // the next forward starts a new order, the last one becomes the previous
  CHECK(order.beforeInThisForward(1) == ForwardOrder::kNone);
  CHECK(order.afterInPreviousForward(2) == 0);
  CHECK(order.afterInPreviousForward(1) == 3);
  CHECK(order.afterInPreviousForward(3) == ForwardOrder::kNone);  // the last: nothing after it
}
