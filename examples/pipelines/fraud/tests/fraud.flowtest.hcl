# The card-testing pattern under test, on the virtual clock. A test runs the pipeline as a service:
# payments match once the watermark is grace (30s) past them, and, once the payments stop, once
# the partition has been idle for the stage's idle_timeout (a minute) and its watermark moves on
# with the clock.

run "the sample's alerts, and its late payment" {
  send {
    source = source.payments
    file   = "../data/payments.jsonl"
  }
  advance = "5m"
  expect {
    sink  = sink.alerts
    match = "unordered"
    messages = [
      { card = "4111-01", amount = 899, merchant = "electronics", first_probe = "2026-03-01T09:00:00Z", payments = ["p01", "p03", "p07"] },
      { card = "4111-02", amount = 1200, merchant = "laptops", first_probe = "2026-03-01T09:06:30Z", payments = ["p14", "p15", "p17"] },
      { card = "4111-03", amount = 720, merchant = "jewellery", first_probe = "2026-03-01T09:01:30Z", payments = ["p04", "p08", "p11"] },
      { card = "4111-03", amount = 720, merchant = "jewellery", first_probe = "2026-03-01T09:03:40Z", payments = ["p08", "p10", "p11"] },
    ]
  }
  expect {
    sink     = sink.late
    messages = [{ payment_id = "p18", card = "4111-04", amount = 1.00, merchant = "coffee", at = "2026-03-01T09:02:00Z" }]
  }
  assert {
    condition     = metrics.card_testing.late == 1
    error_message = "the probe of 09:02 that came after the payment of 09:04 (more than grace later) is late"
  }
}

run "a probe that arrives after the big payment, within grace, still counts" {
  reset = true # a fresh pipeline: the last run left the watermark past these times
  send {
    source = source.payments
    messages = [
      { payment_id = "a1", card = "c1", amount = 1, merchant = "m", at = "2026-03-01T10:00:00Z" },
      { payment_id = "a3", card = "c1", amount = 800, merchant = "m", at = "2026-03-01T10:00:20Z" },
      { payment_id = "a2", card = "c1", amount = 1, merchant = "m", at = "2026-03-01T10:00:10Z" },
    ]
  }
  advance = "2m"
  expect {
    sink     = sink.alerts
    messages = [{ card = "c1", amount = 800, merchant = "m", first_probe = "2026-03-01T10:00:00Z", payments = ["a1", "a2", "a3"] }]
  }
}

run "payments more than 10 minutes apart do not match" {
  reset = true # a fresh pipeline: the last run left the watermark past these times
  send {
    source = source.payments
    messages = [
      { payment_id = "b1", card = "c2", amount = 1, merchant = "m", at = "2026-03-01T10:00:00Z" },
      { payment_id = "b2", card = "c2", amount = 1, merchant = "m", at = "2026-03-01T10:05:00Z" },
      { payment_id = "b3", card = "c2", amount = 900, merchant = "m", at = "2026-03-01T10:10:01Z" },
    ]
  }
  advance = "2m"
  expect {
    sink  = sink.alerts
    count = 0
  }
  assert {
    condition     = metrics.card_testing.late == 0
    error_message = "no payment is late: the attempt from the first probe is given up, not the payments"
  }
}

run "a crash loses no payment that waits in a card's state" {
  reset = true # a fresh pipeline: the last run left the watermark past these times
  send {
    source = source.payments
    messages = [
      { payment_id = "c1", card = "c3", amount = 0.5, merchant = "m", at = "2026-03-01T10:00:00Z" },
      { payment_id = "c2", card = "c3", amount = 0.5, merchant = "m", at = "2026-03-01T10:01:00Z" },
    ]
  }
  step {
    crash = true
  }
  step {
    send {
      source = source.payments
      messages = [
        { payment_id = "c3", card = "c3", amount = 650, merchant = "m", at = "2026-03-01T10:02:00Z" },
      ]
    }
    advance = "3m" # the dead process's leases expire, then the idle minute passes
  }
  expect {
    sink     = sink.alerts
    messages = [{ card = "c3", amount = 650, merchant = "m", first_probe = "2026-03-01T10:00:00Z", payments = ["c1", "c2", "c3"] }]
  }
}
