"""Verification: grading in a fresh sandbox, the outcome taxonomy, cheat detection."""

from lego.verify.grader import InfraFailure, Verifier, grade_log, verify_patch

__all__ = ["InfraFailure", "Verifier", "grade_log", "verify_patch"]
