"""A bench run read back without the model (`draftwise replay`): its baseline answers replayed through
the auto policy and the free drafters, priced by the calibrated cost curve, with the oracle's
schedules for a bound (replay); and the account of where the live run's decode time departs from
that curve (account)."""
