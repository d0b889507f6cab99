# Every node's counters add up: in = out + filtered + dropped + absorbed + dead_lettered +
# in_flight, each message counted once, though a retry waits in the retry set and the process
# dies while the sink's batch is at work (the next process does it again, and counts it once).

mock "counters.split" {
  result {
    outputs = [msg, merge(msg, { copy = true })]
  }
}

mock "counters.check" {
  result { error = "busy" } # o2: retried in 5s, from the retry set
  result {                  # o2's copy: dead-lettered
    error     = "bad"
    permanent = true
  }
  result {} # the rest pass
}

override_sink "hook" {
  responses = [503, 200, 400, 200] # o3 waits for the hook, then passes; its copy is refused; o2 passes
}

run "the counters add up through retries and a crash" {
  send {
    topic = topic.orders
    messages = [
      { customer = "a", id = "o1", amount = 5, at = "2026-01-01T00:00:10Z" }, # filtered by big
      { customer = "a", id = "o2", amount = 20, at = "2026-01-01T00:00:20Z" },
      { customer = "a", id = "o3", amount = 30, at = "2026-01-01T00:02:00Z" }, # closes the first minute
      { customer = "a", id = "o1", amount = 5, at = "2026-01-01T00:00:30Z" },  # a duplicate, dropped by once
      { customer = "a", id = "o4", amount = 1, at = "2026-01-01T00:00:40Z" },  # late, dropped by per_minute
    ]
  }
  advance = "1s" # o2 waits in check's retry set; the hook waits to try o3 again

  step {
    crash = true
  }

  assert {
    condition     = length([for name, c in metrics : name if c.in != c.out + c.filtered + c.dropped + c.absorbed + c.dead_lettered + c.in_flight || c.in_flight != 0]) == 0
    error_message = "every node's counters add up, with nothing left in flight"
  }
  assert {
    condition     = metrics.big.in == 5 && metrics.big.out == 2 && metrics.big.filtered == 3 && metrics.split.out == 2 && metrics.split.written == 4
    error_message = "big passes o2 and o3 on, split writes two of each"
  }
  assert {
    condition     = metrics.check.in == 4 && metrics.check.out == 3 && metrics.check.dead_lettered == 1 && metrics.check.failed_attempts == 2 && metrics.check.retries == 1
    error_message = "check passes three on, one after a retry, and dead-letters one"
  }
  assert {
    condition     = metrics.hook.in == 3 && metrics.hook.out == 2 && metrics.hook.dead_lettered == 1 && metrics.hook.written == 2
    error_message = "the hook takes in each message once, though the crash made it do o3 again"
  }
  assert {
    condition     = metrics.once.in == 5 && metrics.once.out == 4 && metrics.once.dropped == 1 && metrics.once.duplicates == 1
    error_message = "once drops the duplicate"
  }
  assert {
    condition     = metrics.per_minute.in == 4 && metrics.per_minute.absorbed == 3 && metrics.per_minute.dropped == 1 && metrics.per_minute.late == 1 && metrics.totals.in == metrics.per_minute.written
    error_message = "per_minute takes three orders into its windows and drops the late one; totals gets what it writes"
  }
}
