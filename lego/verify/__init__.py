"""Verification: grading in a fresh sandbox, the outcome taxonomy, cheat detection."""

from lego.verify.grader import InfraFailure, TaskHasNoTests, Verifier, judge_report, verify_patch

__all__ = ["InfraFailure", "TaskHasNoTests", "Verifier", "judge_report", "verify_patch"]
