// The engine's names for the public saga vocabulary (include/idemsaga/saga.hpp): the engine
// and the product's sagas say saga::StepResult, a team's code idemsaga::StepResult; one type.
#pragma once

#include "idemsaga/saga.hpp"

namespace idemsaga::steps::saga {

using idemsaga::ActionKey;
using idemsaga::AnswerFn;
using idemsaga::Branch;
using idemsaga::ChildInputFn;
using idemsaga::CompensationKey;
using idemsaga::ConditionFn;
using idemsaga::Definition;
using idemsaga::EventWait;
using idemsaga::Fields;
using idemsaga::InvalidInput;
using idemsaga::IsValidStepName;
using idemsaga::kMaxKeySuffix;
using idemsaga::Outcome;
using idemsaga::OutputParser;
using idemsaga::StepContext;
using idemsaga::StepDefinition;
using idemsaga::StepFn;
using idemsaga::StepKind;
using idemsaga::StepPolicy;
using idemsaga::StepResult;
using idemsaga::SuccessAnswer;
using idemsaga::ToString;
using idemsaga::TraceContext;
using idemsaga::WakeFn;

}  // namespace idemsaga::steps::saga
