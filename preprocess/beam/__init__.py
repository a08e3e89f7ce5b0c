"""The two stages on Apache Beam (same outputs as the local runners)."""
