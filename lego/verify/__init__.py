"""Verification: grading in a fresh sandbox, the outcome taxonomy, cheat detection."""

from lego.verify.grader import Verifier, verify_patch
from lego.verify.grading import InfraFailure
from lego.verify.judge import judge_report
from lego.verify.pytest_grading import TaskHasNoTests

__all__ = ["InfraFailure", "TaskHasNoTests", "Verifier", "judge_report", "verify_patch"]
