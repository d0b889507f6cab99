# Orders through a filter, a fan-out and a check (Go functions the test mocks), to an http sink,
# and through a dedupe to an aggregate that drops late orders: for the test that every node's
# counters add up, retries, dead letters and a crash included.
pipeline "counters" {
  key_prefix = "counters"
}

retry "later" {
  max_attempts = 3
  backoff      = "constant"
  initial      = "5s" # longer than retries wait in the process: a retry waits in the retry set
}

topic "orders" {
  partitions = 1
  key        = msg.customer
}

stage "big" {
  kind  = "filter"
  input = topic.orders
  where = msg.amount > 10
}

stage "split" {
  kind  = "go"
  func  = "counters.split"
  input = stage.big
}

stage "check" {
  kind  = "go"
  func  = "counters.check"
  input = stage.split
  retry = retry.later
}

sink "hook" {
  kind  = "http"
  input = stage.check
  url   = "http://127.0.0.1:9/hook"
  retry = retry.later
}

stage "once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.id
  within     = "1h"
  event_time = msg.at
}

stage "per_minute" {
  kind       = "aggregate"
  input      = stage.once
  group_by   = msg.customer
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  late      = "drop"
  aggregate = { orders = count() }
}

sink "totals" {
  kind  = "stdout"
  input = stage.per_minute
}
