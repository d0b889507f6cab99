# The ledger answers 503 twice, then takes payments again: the payment waits and gets through.

override_sink "ledger" {
  responses = [503, 503, 200]
}

run "a payment waits out a short outage of the ledger" {
  send {
    source   = source.payments
    messages = [{ id = "pay-1", account = "acct-1", amount = "15" }]
  }
  expect {
    sink     = sink.ledger
    messages = [{ id = "pay-1", account = "acct-1", amount_cents = 1500 }]
  }
  assert {
    condition     = metrics.ledger.retries == 2 && metrics.ledger.dead_lettered == 0
    error_message = "the payment is retried twice and not dead-lettered"
  }
}

run "a payment waiting for its retry survives a crash" {
  reset = true
  send {
    source   = source.payments
    messages = [{ id = "pay-2", account = "acct-2", amount = "25" }]
  }
  advance = "100ms" # the first attempt has failed; the retry waits
  step {
    crash = true # the process dies; another takes the partition over when the lease expires
  }
  expect {
    sink     = sink.ledger
    messages = [{ id = "pay-2", account = "acct-2", amount_cents = 2500 }]
  }
}
